import { renderToStaticMarkup } from "react-dom/server";
import { describe, expect, it } from "vitest";
import { prismLanguage } from "../src/CodeBlock";
import { externalHref, Markdown, parseBlocks, safeHref } from "../src/markdown";

const cites = [
  { n: 1, url: "/docs/ros2/nodes#qos", title: "ROS 2 › Nodes" },
  { n: 2, url: "/docs/ros2/actions", title: "ROS 2 › Actions" },
];

function html(text: string): string {
  return renderToStaticMarkup(<Markdown text={text} citations={cites} />);
}

describe("Markdown", () => {
  it("turns citation markers into links to the sources", () => {
    const out = html("QoS matters [1]. See also [1, 2].");
    expect(out).toContain('<a class="tc-cite" href="/docs/ros2/nodes#qos" title="ROS 2 › Nodes" data-cite="1">[1]</a>');
    expect(out.match(/class="tc-cite"/g)).toHaveLength(3);
  });

  it("leaves markers without a matching source as text", () => {
    expect(html("An array [7] and [x].")).toBe("<p>An array [7] and [x].</p>");
  });

  it("renders fenced code verbatim, without Markdown or citations inside", () => {
    const out = html("Run:\n\n```python\nx = a[1] * b *c*\n```\n");
    const code = /<pre class="tc-code" data-lang="python"><code>(.*?)<\/code><\/pre>/.exec(out)![1];
    expect(code.replace(/<[^>]+>/g, "")).toBe("x = a[1] * b *c*");
    expect(out).not.toContain("tc-cite");
  });

  it("highlights code in a language Prism knows and offers to copy it", () => {
    const out = html("```py\n# speed\nif v > 0.5:\n    stop()\n```");
    expect(out).toContain('<span class="token comment"># speed</span>');
    expect(out).toContain('<span class="token keyword">if</span>');
    expect(out).toContain('<span class="token number">0.5</span>');
    expect(out).toContain('aria-label="Copy code"');
    expect(out.replace(/<button.*<\/button>/, "").replace(/<[^>]+>/g, "")).toBe("# speed\nif v &gt; 0.5:\n    stop()");
  });

  it("renders a fence still open mid-stream as code", () => {
    expect(parseBlocks("```bash\nros2 run demo")).toEqual([{ kind: "code", lang: "bash", text: "ros2 run demo" }]);
  });

  it("renders lists, headings, emphasis and inline code", () => {
    const out = html("## Steps\n\n1. **Build** it\n2. run `colcon build`\n\n- *one*\n- two");
    expect(out).toContain("<h4>Steps</h4>");
    expect(out).toContain("<ol><li><strong>Build</strong> it</li><li>run <code>colcon build</code></li></ol>");
    expect(out).toContain("<ul><li><em>one</em></li><li>two</li></ul>");
  });

  it("pairs a code span's backticks by run length, inside emphasis and after a link too", () => {
    expect(html("**`colcon build`** first")).toBe("<p><strong><code>colcon build</code></strong> first</p>");
    expect(html("``a`")).toBe("<p>``a`</p>");
    expect(html("`` a ` b ``")).toBe("<p><code>a ` b</code></p>");
    expect(html("[`](/x) then `code`")).toBe('<p><a href="/x" target="_top">`</a> then <code>code</code></p>');
  });

  it("drops a heading's closing hashes only where a space sets them apart", () => {
    expect(parseBlocks("## Setup ##\n# Using C#\n### #")).toEqual([
      { kind: "heading", level: 2, text: "Setup" },
      { kind: "heading", level: 1, text: "Using C#" },
      { kind: "heading", level: 3, text: "" },
    ]);
  });

  it("escapes HTML from the model instead of rendering it", () => {
    expect(html('<img src=x onerror="alert(1)">')).toBe("<p>&lt;img src=x onerror=&quot;alert(1)&quot;&gt;</p>");
  });

  it("shows a link off the site, protocol-relative ones included, as external, opened in a new tab", () => {
    for (const href of ["//evil.example/x", "/\\evil.example/x", "https://evil.example/x", "HTTP://evil.example"]) {
      const out = html(`[x](${href})`);
      expect(out).toContain('class="tc-external" target="_blank" rel="noopener noreferrer nofollow"');
      expect(out).not.toContain('target="_top"');
    }
    for (const href of ["/docs/ros2/nodes", "#qos", "/docs/x?y=1"]) {
      expect(externalHref(href)).toBe(false);
      expect(html(`[x](${href})`)).toContain('target="_top"');
    }
  });

  it("keeps javascript: links as plain text", () => {
    expect(html("[click](javascript:alert(1))")).not.toContain("<a");
    expect(safeHref("https://example.org")).toBe(true);
    expect(safeHref("/docs/x#y")).toBe(true);
    expect(safeHref("data:text/html,x")).toBe(false);
  });
});

describe("Markdown tables", () => {
  const table = (out: string): string => /<table>.*<\/table>/.exec(out)?.[0] ?? "";

  it("renders a header, body rows and each column's alignment", () => {
    const out = html("| Tool | Runs | Cost |\n| :--- | :---: | ---: |\n| ros2 run | *one* node | 0 |");
    expect(table(out)).toBe(
      "<table><thead><tr>" +
        '<th scope="col" style="text-align:left">Tool</th>' +
        '<th scope="col" style="text-align:center">Runs</th>' +
        '<th scope="col" style="text-align:right">Cost</th>' +
        "</tr></thead><tbody><tr>" +
        '<td style="text-align:left">ros2 run</td>' +
        '<td style="text-align:center"><em>one</em> node</td>' +
        '<td style="text-align:right">0</td>' +
        "</tr></tbody></table>",
    );
  });

  it("reads a table without outer pipes, and leaves unaligned columns unstyled", () => {
    expect(table(html("Tool | Runs\n--- | ---\nros2 | node"))).toBe(
      '<table><thead><tr><th scope="col">Tool</th><th scope="col">Runs</th></tr></thead>' +
        "<tbody><tr><td>ros2</td><td>node</td></tr></tbody></table>",
    );
  });

  it("leaves a header whose delimiter row has another cell count as a paragraph", () => {
    expect(html("| a | b |\n| --- |\n| 1 | 2 |")).toBe("<p>| a | b |\n| --- |\n| 1 | 2 |</p>");
  });

  it("pads short body rows with empty cells and drops extra cells", () => {
    expect(table(html("| a | b |\n|---|---|\n| 1 |\n| 1 | 2 | 3 |"))).toContain(
      "<tbody><tr><td>1</td><td></td></tr><tr><td>1</td><td>2</td></tr></tbody>",
    );
  });

  it("keeps an escaped pipe inside a cell, in text and in code", () => {
    expect(table(html("| op | means |\n|---|---|\n| `a \\| b` | a or b \\| c |"))).toContain(
      "<td><code>a | b</code></td><td>a or b | c</td>",
    );
  });

  it("links citations inside cells", () => {
    const out = html("| Feature | Where |\n|---|---|\n| Actions | see [2] |");
    expect(table(out)).toContain(
      '<td>see <a class="tc-cite" href="/docs/ros2/actions" title="ROS 2 › Actions" data-cite="2">[2]</a></td>',
    );
  });

  it("renders a table as it streams in: a header alone is a paragraph, then an empty table, then rows", () => {
    expect(html("| Tool | Use |")).toBe("<p>| Tool | Use |</p>");
    expect(html("| Tool | Use |\n| --- | --")).toContain("<thead>");
    const headerOnly = html("| Tool | Use |\n| --- | --- |\n");
    expect(headerOnly).not.toContain("<p>");
    expect(table(headerOnly)).toContain("</thead><tbody></tbody></table>");
    const typing = (row: string): string => table(html(`| Tool | Use |\n| --- | --- |\n${row}`));
    expect(typing("| ros2 | ru")).toContain("<tbody><tr><td>ros2</td><td>ru</td></tr>");
    expect(typing("| ros2")).toContain("<tbody><tr><td>ros2</td><td></td></tr>");
  });

  it("separates a table from the paragraph line above it and the list below it", () => {
    const out = html("Compare them:\n| A | B |\n|---|---|\n| 1 | 2 |\n- first\n- second");
    const [before, after] = out.split(table(out));
    expect(before).toMatch(/^<p>Compare them:<\/p><div class="tc-table-scroll"[^>]*>$/);
    expect(after).toBe("</div><ul><li>first</li><li>second</li></ul>");
    expect(out.match(/<tr>/g)).toHaveLength(2);
  });

  it("ends a table at a blank line", () => {
    expect(html("| A |\n|---|\n| 1 |\n\nAfter.")).toMatch(/<\/table><\/div><p>After\.<\/p>$/);
  });

  it("escapes HTML in cells instead of rendering it", () => {
    const out = html('| <script>alert(1)</script> |\n|---|\n| <img src=x onerror="alert(1)"> |');
    expect(out).not.toMatch(/<script|<img/);
    expect(out).toContain("<th scope=\"col\">&lt;script&gt;alert(1)&lt;/script&gt;</th>");
    expect(out).toContain("<td>&lt;img src=x onerror=&quot;alert(1)&quot;&gt;</td>");
  });

  it("puts the table in a focusable scroll box named after its header", () => {
    expect(html("| **Feature** | ROS 2 [1] |\n|---|---|")).toMatch(
      /^<div class="tc-table-scroll" role="region" aria-label="Table: Feature, ROS 2" tabindex="0"><table>/,
    );
  });

  it("never throws, on any prefix of an answer with a table or on scrambled table syntax", () => {
    const answer = "Compare:\n\n| A \\| x | `b` [1] |\n| :-- | --: |\n| **1** | [2] |\n| 3\n\nDone.";
    for (let end = 0; end <= answer.length; end++) expect(() => html(answer.slice(0, end))).not.toThrow();
    const pieces = ["|", "-", ":", " ", "\\", "`", "\n", "a", "[1]", "*", "> ", "- ", "```", "|---|"];
    let seed = 7;
    for (let n = 0; n < 300; n++) {
      let text = "";
      for (let k = 0; k < 40; k++) {
        seed = (seed * 1103515245 + 12345) % 2147483648;
        text += pieces[seed % pieces.length];
      }
      expect(() => html(text), text).not.toThrow();
    }
  });
});

describe("prismLanguage", () => {
  it("maps the fence names books use to Prism's", () => {
    expect(["py", "C++", "xml", "urdf", "yml", "python", ""].map(prismLanguage)).toEqual([
      "python", "cpp", "markup", "markup", "yaml", "python", "",
    ]);
  });
});
