import { describe, expect, it } from "vitest";
import { inAppPath, type ClickLike } from "../src/navigation";

const plain: ClickLike = { button: 0, metaKey: false, ctrlKey: false, shiftKey: false, altKey: false, defaultPrevented: false };
const here = { origin: "https://book.example.org" };

function link(href: string, attrs: Record<string, string> = {}) {
  return { href, target: attrs.target ?? "", hasAttribute: (name: string) => name in attrs };
}

describe("inAppPath", () => {
  it("hands a plain click on a same-site citation to the router, fragment included", () => {
    expect(inAppPath(link("https://book.example.org/docs/ros2/nodes?x=1#qos"), plain, here)).toBe("/docs/ros2/nodes?x=1#qos");
    expect(inAppPath(link("/docs/intro#zmp", { target: "_top" }), plain, here)).toBe("/docs/intro#zmp");
  });

  it("leaves new-tab clicks, other sites, downloads and other targets to the browser", () => {
    for (const key of ["metaKey", "ctrlKey", "shiftKey", "altKey"] as const) {
      expect(inAppPath(link("/docs/a"), { ...plain, [key]: true }, here)).toBeNull();
    }
    expect(inAppPath(link("/docs/a"), { ...plain, button: 1 }, here)).toBeNull();
    expect(inAppPath(link("/docs/a"), { ...plain, defaultPrevented: true }, here)).toBeNull();
    expect(inAppPath(link("https://elsewhere.org/docs/a"), plain, here)).toBeNull();
    expect(inAppPath(link("/files/a.pdf", { download: "" }), plain, here)).toBeNull();
    expect(inAppPath(link("/docs/a", { target: "_blank" }), plain, here)).toBeNull();
    expect(inAppPath(link("mailto:a@b.c"), plain, here)).toBeNull();
  });
});
