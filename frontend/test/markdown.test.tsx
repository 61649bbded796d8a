import { renderToStaticMarkup } from "react-dom/server";
import { describe, expect, it } from "vitest";
import { Markdown, parseBlocks, safeHref } from "../src/markdown";

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
    expect(out).toContain('<pre class="tc-code" data-lang="python"><code>x = a[1] * b *c*</code></pre>');
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

  it("escapes HTML from the model instead of rendering it", () => {
    expect(html('<img src=x onerror="alert(1)">')).toBe("<p>&lt;img src=x onerror=&quot;alert(1)&quot;&gt;</p>");
  });

  it("keeps javascript: links as plain text", () => {
    expect(html("[click](javascript:alert(1))")).not.toContain("<a");
    expect(safeHref("https://example.org")).toBe(true);
    expect(safeHref("/docs/x#y")).toBe(true);
    expect(safeHref("data:text/html,x")).toBe(false);
  });
});
