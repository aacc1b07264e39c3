"""Long documents: split at paragraph boundaries to fit the limit a prompt_too_long refusal
names, process the parts, then one request that combines them."""
import re
from dataclasses import dataclass, field
from typing import Callable, List, Optional

from .errors import Refused

# Characters per token assumed when turning a token limit into a text size: English runs
# ~4; 3 leaves room for other text and for the instruction around each part.
CHARS_PER_TOKEN = 3


def token_limit_of(message):
    """The token limit a prompt_too_long refusal names, or None."""
    for pattern in (r"parts of at most (\d+) tokens", r"at most (\d+) are accepted", r"\((\d+) tokens\)"):
        m = re.search(pattern, message)
        if m:
            return int(m.group(1))
    return None


def split_paragraphs(text, max_chars):
    """Parts of at most max_chars, cut between paragraphs (blank lines); a paragraph that is
    too long alone is cut between sentences, and a sentence that is too long, anywhere."""
    def pieces(paragraph):
        if len(paragraph) <= max_chars:
            return [paragraph]
        out, cur = [], ""
        for sentence in re.split(r"(?<=[.!?])\s+", paragraph):
            while len(sentence) > max_chars:
                if cur:
                    out.append(cur)
                    cur = ""
                out.append(sentence[:max_chars])
                sentence = sentence[max_chars:]
            if cur and len(cur) + 1 + len(sentence) > max_chars:
                out.append(cur)
                cur = sentence
            else:
                cur = f"{cur} {sentence}" if cur else sentence
        if cur:
            out.append(cur)
        return out

    parts, cur = [], ""
    for paragraph in (p.strip() for p in re.split(r"\n\s*\n", text)):
        if not paragraph:
            continue
        for piece in pieces(paragraph):
            if cur and len(cur) + 2 + len(piece) > max_chars:
                parts.append(cur)
                cur = piece
            else:
                cur = f"{cur}\n\n{piece}" if cur else piece
    if cur:
        parts.append(cur)
    return parts


@dataclass
class LongDocumentResult:
    text: str                       # the answer for the whole document
    parts: List[str] = field(default_factory=list)     # the parts sent (empty: it fit whole)
    partials: List[str] = field(default_factory=list)  # each part's answer


def process_long_document(client, document, instruction="Summarize the following text.",
                          combine_instruction="Combine these summaries of consecutive parts of one document "
                                              "into one summary.",
                          on_partial: Optional[Callable[[int, str], None]] = None, max_part_chars=None, **params):
    """Sends the document whole; if it is refused as too long, splits it (at most max_part_chars
    per part, or what the refusal's token limit allows), processes each part (on_partial(i,
    answer) as each ends), then combines the answers in one request."""
    def ask(text, what):
        return client.chat([{"role": "system", "content": what}, {"role": "user", "content": text}], **params)

    if max_part_chars is None:
        try:
            return LongDocumentResult(ask(document, instruction).text)
        except Refused as e:
            if e.result is None or e.result.reason != "prompt_too_long":
                raise
            limit = token_limit_of(e.result.message)
            if limit is None:
                raise
            max_part_chars = max(200, limit * CHARS_PER_TOKEN - len(instruction) - 64)
    parts = split_paragraphs(document, max_part_chars)
    partials = []
    for i, part in enumerate(parts):
        answer = ask(part, instruction).text
        partials.append(answer)
        if on_partial:
            on_partial(i, answer)
    joined = "\n\n".join(f"Part {i + 1}: {a}" for i, a in enumerate(partials))
    final = ask(joined, combine_instruction).text if len(parts) > 1 else partials[0]
    return LongDocumentResult(final, parts, partials)
