"""A chat's prompt token ids: the chat template's own special tokens as control tokens, the text of every
message as text. A passage or question holding "<|im_end|>" must not end its turn and open another
(prompt injection from the corpus: SmolLM2 answered 1890 for 1958 over a passage holding "<|endoftext|>")."""

from __future__ import annotations

import re
import uuid


def special_tokens(tokenizer) -> re.Pattern | None:
    """What matches a special token's string (longest first, as the tokenizer matches them); None: it has
    none. The tokens a tokenizer takes as one control token wherever their string stands in a text, and
    that ``split_special_tokens`` spells as ordinary tokens instead."""
    added = getattr(tokenizer, "added_tokens_decoder", {})  # not an HF tokenizer's: none known, the prompt as ever
    specials = sorted({t.content for t in added.values() if t.special}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, specials))) if specials else None


def chat_token_ids(tokenizer, chat: list[dict[str, str]], specials: re.Pattern | None) -> list[int]:
    """The prompt of ``chat`` with the assistant's turn begun. A chat whose messages hold no special
    token's string is templated and tokenized as it always was (the same ids: measured results and the
    request cache depend on them)."""
    if specials is None or not any(specials.search(m["content"]) for m in chat):
        ids = tokenizer.apply_chat_template(chat, tokenize=True, add_generation_prompt=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # some tokenizers return a BatchEncoding
    return _contents_as_text(tokenizer, chat, specials)


def _contents_as_text(tokenizer, chat: list[dict[str, str]], specials: re.Pattern) -> list[int]:
    """The template rendered around placeholders tells its own special tokens from the messages' text.
    The prompt is then cut only at the template's special tokens, as a tokenizer cuts a text at every
    special token, and each piece between two (template text and message text together, so that they
    merge at their seam as before) is tokenized with the special tokens' strings spelled out."""
    nonce = uuid.uuid4().hex
    marks = [f"[message {i} {nonce}]" for i in range(len(chat))]
    around = tokenizer.apply_chat_template([{**m, "content": mark} for m, mark in zip(chat, marks)],
                                           tokenize=False, add_generation_prompt=True)
    parts = re.split("(" + "|".join(map(re.escape, marks)) + ")", around)  # template text at even places
    if parts[1::2] != marks:
        raise ValueError("the chat template does not show each message once, in order: a message holding a special "
                         "token's string cannot be kept as text")
    filled = [p if i % 2 == 0 else chat[i // 2]["content"] for i, p in enumerate(parts)]
    if "".join(filled) != tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True):
        raise ValueError("the chat template changes a message's text: a message holding a special token's string "
                         "cannot be kept as text")
    # a tokenizer whose pieces do not add up to its whole text (one that begins every text with a space)
    # would change the tokens of the template's text too
    if _cut_at_template_specials(tokenizer, [around], specials) != tokenizer(around, add_special_tokens=False)["input_ids"]:
        raise ValueError("this tokenizer tokenizes a prompt's pieces unlike the whole: a message holding a special "
                         "token's string cannot be kept as text")
    return _cut_at_template_specials(tokenizer, filled, specials)


def _cut_at_template_specials(tokenizer, parts: list[str], specials: re.Pattern) -> list[int]:
    """Token ids of ``"".join(parts)``: the special tokens of the template's text (``parts`` at even places)
    one id each, what lies between them (messages' text at odd places included) tokenized as text."""
    ids, text = [], ""
    for i, part in enumerate(parts):
        if i % 2:
            text += part
            continue
        at = 0
        for special in specials.finditer(part):
            ids += _as_text(tokenizer, text + part[at:special.start()]) + [tokenizer.convert_tokens_to_ids(special.group())]
            text, at = "", special.end()
        text += part[at:]
    return ids + _as_text(tokenizer, text)


def _as_text(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"] if text else []
