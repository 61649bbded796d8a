import { describe, expect, it } from "vitest";
import { fitRow, parseDelimiterRow, readTable, splitRow, tableLabel } from "../src/markdownTable";

const noBlock = (): boolean => false;

describe("splitRow", () => {
  it("splits a row at its pipes, outer pipes optional, cells trimmed", () => {
    expect(splitRow("| a | b |")).toEqual(["a", "b"]);
    expect(splitRow("a | b")).toEqual(["a", "b"]);
    expect(splitRow("  |a|b  ")).toEqual(["a", "b"]);
    expect(splitRow("| a | |")).toEqual(["a", ""]);
    expect(splitRow("a")).toEqual(["a"]);
  });

  it("reads \\| as a literal pipe, while an escaped backslash before a pipe still splits", () => {
    expect(splitRow("| a \\| b | c |")).toEqual(["a | b", "c"]);
    expect(splitRow("| a \\\\| b |")).toEqual(["a \\\\", "b"]);
    expect(splitRow("| \\*x\\* |")).toEqual(["\\*x\\*"]);
  });

  it("splits at a pipe inside a code span, as GFM does, unless it is escaped", () => {
    expect(splitRow("| `a|b` |")).toEqual(["`a", "b`"]);
    expect(splitRow("| `a\\|b` |")).toEqual(["`a|b`"]);
  });
});

describe("parseDelimiterRow", () => {
  it("reads each column's alignment from the colons", () => {
    expect(parseDelimiterRow("| --- | :--- | :---: | ---: |")).toEqual([null, "left", "center", "right"]);
    expect(parseDelimiterRow("-|:-:")).toEqual([null, "center"]);
  });

  it("rejects lines that are not delimiter rows", () => {
    for (const line of ["| a | --- |", "| : | --- |", "| | --- |", "---", ":---:", "| -- - |", "| a |"]) {
      expect(parseDelimiterRow(line), line).toBeNull();
    }
  });
});

describe("readTable", () => {
  it("needs a delimiter row with as many cells as the header", () => {
    expect(readTable(["| a | b |", "| --- |"], 0, noBlock)).toBeNull();
    expect(readTable(["| a |", "| --- | --- |"], 0, noBlock)).toBeNull();
    expect(readTable(["| a | b |"], 0, noBlock)).toBeNull();
    expect(readTable(["| a | b |", "| --- | --- |"], 0, noBlock)).toEqual({
      table: { align: [null, null], header: ["a", "b"], rows: [], columns: 2, rowCount: 0 },
      end: 2,
    });
  });

  it("pads short rows with empty cells and cuts long ones", () => {
    expect(fitRow(["x"], 3)).toEqual(["x", "", ""]);
    const read = readTable(["a | b", "--|--", "1", "1 | 2 | 3 | 4"], 0, noBlock);
    expect(read?.table.rows).toEqual([
      ["1", ""],
      ["1", "2"],
    ]);
  });

  it("ends at a blank line or a line that starts a block, and takes any other line as a row, as GFM does", () => {
    const lines = ["a | b", "--|--", "1 | 2", "more", "", "after"];
    expect(readTable(lines, 0, noBlock)).toMatchObject({ table: { rows: [["1", "2"], ["more", ""]] }, end: 4 });
    expect(readTable(lines, 0, (line) => line === "more")).toMatchObject({ table: { rows: [["1", "2"]] }, end: 3 });
  });
});

describe("tableLabel", () => {
  it("names a table from its header's plain text", () => {
    expect(tableLabel(["**Feature**", "`ros2` [1]", "[Docs](/docs/x)", "max_speed"])).toBe(
      "Table: Feature, ros2, Docs, max_speed",
    );
    expect(tableLabel(["", " "])).toBe("Table");
  });
});
