import { describe, expect, it } from "vitest";
import { atBottom } from "../src/scroll";

describe("atBottom", () => {
  it("is true at the bottom and within the slack", () => {
    expect(atBottom({ scrollTop: 600, scrollHeight: 1000, clientHeight: 400 })).toBe(true);
    expect(atBottom({ scrollTop: 580, scrollHeight: 1000, clientHeight: 400 })).toBe(true);
  });

  it("is false once the reader has scrolled up past the slack", () => {
    expect(atBottom({ scrollTop: 500, scrollHeight: 1000, clientHeight: 400 })).toBe(false);
    expect(atBottom({ scrollTop: 0, scrollHeight: 1000, clientHeight: 400 })).toBe(false);
  });

  it("is true when everything fits", () => {
    expect(atBottom({ scrollTop: 0, scrollHeight: 300, clientHeight: 400 })).toBe(true);
  });
});
