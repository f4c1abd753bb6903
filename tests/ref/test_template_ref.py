"""Chat rendering and loss masks of `ftune tokenize --data` against an independent reference:
the model's own Jinja chat_template rendered as transformers does (jinja2 sandbox with
trim_blocks/lstrip_blocks, formats.md 7.1) and tokenized with the `tokenizers` package
(add_special_tokens=False for chat templates, formats.md 8.2).

Mask reference (transformers' return_assistant_tokens_mask rule, from the Jinja renderings and
the `tokenizers` offsets, not from ftune's logic): the trained character span of assistant turn
i runs from len(render(messages[:i]) + assistant header) to len(render(messages[:i+1])) minus
the template's untrained tail after the end-of-turn token ("\n" for ChatML); a token is
trained when its offsets overlap a trained span.
"""
import json
import subprocess
from pathlib import Path

import pytest

jinja2 = pytest.importorskip("jinja2")
tokenizers = pytest.importorskip("tokenizers")
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

from tok_helpers import ROOT, ftune_bin  # noqa: E402

LLAMA3 = ROOT / "tests" / "fixtures" / "tokenizers" / "llama3"

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}],
    [{"role": "system", "content": "You answer in one word."},
     {"role": "user", "content": "  Capital of France?  "},
     {"role": "assistant", "content": "  Paris.\n"},
     {"role": "user", "content": "And of Japan?"},
     {"role": "assistant", "content": "Tokyo — 東京 😀"}],
    [{"role": "user", "content": "Write a haiku about tabs\tand\nnewlines."},
     {"role": "assistant", "content": "Tabs\tline up\nnewlines fall\nspaces  wait"},
     {"role": "user", "content": "Again, in French."},
     {"role": "assistant", "content": "Les tabulations s'alignent."}],
]
HEADERS = {
    "llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "chatml": "<|im_start|>assistant\n",
}
TAILS = {"llama3": "", "chatml": "\n"}


def render(template, messages, bos, eos):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, bos_token=bos, eos_token=eos,
                                            add_generation_prompt=False)


def expected(tok, template, kind, messages, bos, eos):
    text = render(template, messages, bos, eos)
    enc = tok.encode(text, add_special_tokens=False)
    ids = enc.ids
    spans = []  # character spans of trained text: assistant content + end-of-turn token
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        pre = render(template, messages[:i], bos, eos) if i else ""
        upto = render(template, messages[:i + 1], bos, eos)
        tail = TAILS[kind]
        assert upto.endswith(tail) and text.startswith(upto)
        spans.append((len(pre + HEADERS[kind]), len(upto) - len(tail)))
    # a token is trained when it overlaps a trained span (transformers' assistant mask)
    labels = [t if any(s < end and beg < e for beg, end in spans) else -100
              for t, (s, e) in zip(ids, enc.offsets)]
    return ids, labels


def ftune_rows(model, data_path):
    r = subprocess.run([ftune_bin(), "tokenize", "--model", str(model), "--data", str(data_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [json.loads(l) for l in r.stdout.splitlines()]


def check(tmp_path, model, tok, template, kind, bos, eos):
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": c}, ensure_ascii=False) + "\n"
                            for c in CONVERSATIONS))
    rows = ftune_rows(model, data)
    assert len(rows) == len(CONVERSATIONS)
    for c, row in zip(CONVERSATIONS, rows):
        ids, labels = expected(tok, template, kind, c, bos, eos)
        assert row["ids"] == ids
        n_trained = sum(l != -100 for l in labels)
        assert n_trained > 0
        assert row["labels"] == labels, "mask differs"
    # the same conversations as ShareGPT records give the same rows
    sg = tmp_path / "sharegpt.jsonl"
    role = {"user": "human", "assistant": "gpt", "system": "system"}
    sg.write_text("".join(json.dumps({"conversations": [{"from": role[m["role"]], "value": m["content"]}
                                                        for m in c]}) + "\n" for c in CONVERSATIONS))
    assert ftune_rows(model, sg) == rows


def test_llama3_template(tmp_path):
    """The fixture's template (the base Meta-Llama-3-8B repository's) appends the assistant
    header unconditionally; the Instruct model's template, which ftune's llama3 renderer
    follows (formats.md 7.2), guards it with add_generation_prompt. The test applies that
    guard and otherwise uses the fixture's template verbatim."""
    cfg = json.loads((LLAMA3 / "tokenizer_config.json").read_text())
    tok = tokenizers.Tokenizer.from_file(str(LLAMA3 / "tokenizer.json"))
    gen = "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    template = cfg["chat_template"]
    assert template.endswith(gen), template[-80:]
    template = template[: -len(gen)] + "{% if add_generation_prompt %}" + gen + "{% endif %}"
    check(tmp_path, LLAMA3, tok, template, "llama3", cfg["bos_token"], cfg["eos_token"])


def test_smollm2_chatml_template(tmp_path):
    """The example model's ChatML template (with SmolLM2's default system turn) from its GGUF."""
    gguf = pytest.importorskip("gguf")
    from tok_helpers import fetch_example, gguf_hf_tokenizer
    path, why = fetch_example()
    if path is None:
        pytest.skip("example model unavailable: " + why)
    reader = gguf.GGUFReader(path)
    f = reader.fields["tokenizer.chat_template"]
    template = bytes(f.parts[f.data[0]]).decode()
    tok = gguf_hf_tokenizer(path)  # the `tokenizers` BPE built from the GGUF vocabulary
    toks = reader.fields["tokenizer.ggml.tokens"]
    def tok_str(key):
        i = int(reader.fields[key].parts[reader.fields[key].data[0]][0])
        return bytes(toks.parts[toks.data[i]]).decode()
    check(tmp_path, path, tok, template, "chatml", tok_str("tokenizer.ggml.bos_token_id"),
          tok_str("tokenizer.ggml.eos_token_id"))
