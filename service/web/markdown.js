// Answers as Markdown: marked turns the model's text into HTML, DOMPurify removes from that HTML
// whatever could run (scripts, event handler attributes, javascript: links) before the page
// inserts it. Both are vendored under /static/vendor/ (see its README) and loaded as classic
// scripts before the modules, which read them from `window`.
//
// While tokens stream, an answer's text grows many times per frame; it is parsed again at most
// once per animation frame (`schedule`), and at once when the answer ends (`flush`), so what a
// finished answer shows never waits for the next frame. `markdown.renders` counts the renders
// (shown as `window.agentstream.markdownRenders`), so the browser tests can tell they are
// coalesced.

const { marked, DOMPurify } = window;
const pending = new Set();
let frame = 0;

// Links from the model open in a new tab, and never tell the target who sent the reader.
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

// The element's Markdown source as sanitized HTML. The trim keeps the text exactly the source's
// for a plain paragraph (marked ends each block with a newline).
function render(holder) {
  const source = holder.markdownSource || "";
  const html = marked.parse(source, { gfm: true, breaks: false, async: false }).trim();
  holder.innerHTML = DOMPurify.sanitize(html, { USE_PROFILES: { html: true } });
  markdown.renders += 1;
}

function runFrame() {
  frame = 0;
  const holders = Array.from(pending);
  pending.clear();
  for (const holder of holders) render(holder);
}

export const markdown = {
  renders: 0,
  // Set an element's Markdown source; it is rendered on the next animation frame.
  schedule(holder, source) {
    holder.markdownSource = source;
    pending.add(holder);
    if (!frame) frame = requestAnimationFrame(runFrame);
  },
  // Render the element now if a render of it is pending (an answer that has ended).
  flush(holder) {
    if (!pending.delete(holder)) return;
    render(holder);
    if (!pending.size && frame) {
      cancelAnimationFrame(frame);
      frame = 0;
    }
  },
  // The source of what an element shows.
  source(holder) {
    return holder.markdownSource || "";
  },
};
