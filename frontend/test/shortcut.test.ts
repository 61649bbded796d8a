import { describe, expect, it } from "vitest";
import { isOpenShortcut } from "../src/shortcut";

describe("isOpenShortcut", () => {
  const key = (init: Partial<KeyboardEvent>) => ({ key: "i", ctrlKey: false, metaKey: false, altKey: false, shiftKey: false, ...init });

  it("is Ctrl+I, or ⌘+I on a Mac", () => {
    expect(isOpenShortcut(key({ ctrlKey: true }), false)).toBe(true);
    expect(isOpenShortcut(key({ metaKey: true }), true)).toBe(true);
    expect(isOpenShortcut(key({ key: "I", ctrlKey: true }), false)).toBe(true);
  });

  it("leaves other chords to the page and the browser", () => {
    expect(isOpenShortcut(key({}), false)).toBe(false);
    expect(isOpenShortcut(key({ metaKey: true }), false)).toBe(false);
    expect(isOpenShortcut(key({ ctrlKey: true }), true)).toBe(false);
    expect(isOpenShortcut(key({ ctrlKey: true, shiftKey: true }), false)).toBe(false);
    expect(isOpenShortcut(key({ ctrlKey: true, altKey: true }), false)).toBe(false);
    expect(isOpenShortcut(key({ key: "k", ctrlKey: true }), false)).toBe(false);
  });
});
