"""Text into HTML, escaped: `esc` (gr.HTML sets innerHTML unsanitised, so every piece of model
or user text goes through it), token pieces, plain text, the message boxes."""

import html

REPLACEMENT = "\ufffd"


def esc(text) -> str:
    return html.escape(str(text), quote=True)


class Pieces:
    """Incremental per-token text: `add(ids)` returns the text each new token adds, so that the
    pieces join to decode(all ids). A token that ends inside a multi-byte character adds "" and
    the token completing it adds the whole character. Each token is decoded after the previous
    one and the previous one's text is cut off, because SentencePiece-style decoders drop a
    word-initial space at the start of a decode."""

    def __init__(self, decode):
        self.decode = decode
        self.pending = []  # tokens whose bytes do not yet form whole characters
        self.previous = []  # the last complete token, as left context

    def add(self, ids: list) -> list:
        out = []
        for tok in ids:
            self.pending.append(tok)
            text = self.decode(self.previous + self.pending)
            if text.endswith(REPLACEMENT) and len(self.pending) < 4:
                out.append("")  # incomplete UTF-8 (at most 4 bytes): wait for the next token
                continue
            head = self.decode(self.previous) if self.previous else ""
            out.append(text[len(head) :] if text.startswith(head) else self.decode(self.pending))
            self.previous, self.pending = self.pending[-1:], []
        return out


def show_text(text: str, inline: bool = False) -> str:
    """Escaped text with whitespace made visible: a newline shows a faint return mark (and breaks
    the line unless `inline`), a tab an arrow. Spaces stay spaces in running text (the panes use
    pre-wrap); `inline` text (a rejected draft, a table cell) shows them as ␣."""
    out = []
    for ch in text:
        if ch == " " and inline:
            out.append('<span class="ws">␣</span>')
        elif ch == "\n":
            out.append('<span class="ws">↵</span>' + ("" if inline else "\n"))
        elif ch == "\t":
            out.append('<span class="ws">⇥</span>' + ("" if inline else "\t"))
        elif ch == "\r":
            continue
        else:
            out.append(esc(ch))
    return "".join(out)


def token_span(text: str, cls: str, tip: str, inline: bool = False) -> str:
    shown = show_text(text, inline) if text else '<span class="ws">∅</span>'
    if text and not text.strip():
        cls += " tok-blank"  # whitespace-only token: the background shows where it is
    return f'<span class="tok {cls}" title="{esc(tip)}">{shown}</span>'


def plain_text_html(text: str, placeholder="") -> str:
    if not text:
        return f'<div class="out empty">{esc(placeholder)}</div>'
    return f'<div class="out">{show_text(text)}</div>'


def error_html(message: str) -> str:
    return f'<div class="error-panel"><b>Something went wrong</b><div>{esc(message)}</div></div>'


def info_html(message: str) -> str:
    return f'<div class="info-panel">{esc(message)}</div>'


def warning_html(message: str) -> str:
    return f'<div class="warning-panel"><b>Warning:</b> {esc(message)}</div>'
