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

describe("prismLanguage", () => {
  it("maps the fence names books use to Prism's", () => {
    expect(["py", "C++", "xml", "urdf", "yml", "python", ""].map(prismLanguage)).toEqual([
      "python", "cpp", "markup", "markup", "yaml", "python", "",
    ]);
  });
});
