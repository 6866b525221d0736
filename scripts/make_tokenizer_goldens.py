#!/usr/bin/env python3
"""Tokenizer goldens for tests/test_tokenizer.cpp, from an independent implementation.

Writes tests/fixtures/tokenizer/:
  llama3_tiny.gguf   a vocabulary-only GGUF: byte-level BPE trained here with the
                     `tokenizers` package, tokenizer.ggml.pre = "llama-bpe", Llama-3
                     control tokens and the Llama-3 chat template
  spm_tiny.gguf      a vocabulary-only GGUF: SentencePiece BPE with byte fallback trained
                     here with the `sentencepiece` package (tokenizer.ggml.model =
                     "llama"), the Llama-2 [INST] chat template
  no_tokenizer.gguf, unknown_model.gguf, unknown_pre.gguf   refused GGUFs
  goldens.tsv        per model and string: llama.cpp's ids (llama-cpp-python, vocab_only)
                     with (add_special, parse_special) = (0, 0) and (1, 1)
  chat.tsv           per model: a fixed conversation rendered by the model's own Jinja
                     template (jinja2), and llama.cpp's ids of that text

goldens.tsv lines: model <TAB> add_special <TAB> parse_special <TAB> hex(utf-8 text)
<TAB> ids (comma separated). chat.tsv lines: model <TAB> conversation name <TAB>
hex(rendered text) <TAB> ids. "smollm2" is models/SmolLM2-135M-Instruct.Q4_1.gguf.

Needs: pip install llama-cpp-python gguf tokenizers sentencepiece jinja2 numpy.
Run from the repository root: python3 scripts/make_tokenizer_goldens.py
"""
import os
import random
import sys

import gguf
import jinja2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizer")
SMOLLM2 = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)

# ------------------------------------------------------------------ the strings --

PROSE = [
    "Hello world", "Hello, world!", "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France?", "I'm sure you'll see they've done it; we'd better go.",
    "It's ISN'T it? YOU'LL SEE. They'RE here.", "Don't stop-believing... (really) [sic] {ok}",
    "e-mail: someone@example.com, web: https://example.org/a?b=c&d=e#frag",
    "A sentence.  Two spaces.   Three spaces.", "UPPER lower MiXeD CamelCase snake_case kebab-case",
    "semi;colon:colon,comma.period!bang?question", "quotes \"double\" 'single' `back`",
    "Tabs\tbetween\twords", "ends with space ", " starts with space", "a", "I", " ", "\n",
]
CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n",
    "class A:\n    def __init__(self):\n        self.x = 1\n\n    def y(self):\n        pass\n",
    "if x == 1:\n        print('deep')\n    else:\n  pass",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
    "const f = (a, b) => a ?? b;  // comment\n",
    "<div class=\"x\">&nbsp;</div>", "SELECT * FROM t WHERE id = 7;", "x+=1;y-=2;z*=3;w/=4",
    "    indented four\n        indented eight\n", "```python\nprint(1)\n```",
    "key: value\n  - item\n  - item2\n", "a_b__c___d", "$HOME/path/to/file.txt", "0x1F 0b1010 0o777",
]
NUMBERS = [
    "1", "12", "123", "1234", "12345", "1234567890", "3.14", "3.14159265358979", "-42", "+7",
    "1,000,000", "1e10", "2.5e-3", "v1.2.3", "2024-06-01", "12:30:45", "100%", "$19.99",
    "phone 555-0123", "a1b2c3", "007", "0.0001", "99 bottles", "1st 2nd 3rd 4th", "١٢٣ ٤٥",
    "½ ¾ ² ³", "ⅫⅣ", "１２３",
]
SPACES = [
    "  ", "   ", "    ", "\t", "\t\t", "\n\n", "\n\n\n", "\r\n", " \n ", "a  b", "a   b", "a\t\tb",
    "a \n b", "a\n\n\nb", "word   \n", "  \n\n  x", "x\n   \n   y", " \t \t ", "\u00a0nbsp\u00a0", "a\u3000b",
]
ACCENTED = [
    "café", "naïve", "résumé", "Zürich", "São Paulo", "Ångström", "crème brûlée", "façade", "Øresund",
    "Dvořák", "Łódź", "ñandú", "Ærøskøbing", "déjà vu", "piñata", "Straße", "İstanbul", "ı i İ I",
]
GREEK_CYRILLIC = [
    "Ελληνικά", "Καλημέρα κόσμε", "αβγδε ΑΒΓΔΕ", "Привет, мир!", "кириллица", "Съешь же ещё этих мягких французских булок",
    "Україна", "Ѳеодоръ", "μ-λ-π", "ΣΊΣΥΦΟΣ",
]
CJK = [
    "日本語", "こんにちは世界", "カタカナ", "中文字符", "你好，世界！", "한국어", "안녕하세요", "漢字かなカナ混じり文",
    "東京タワー 333m", "『引用』「かぎ」", "一二三四五", "중국어와 日本語 mixed",
]
EMOJI = [
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇫🇷🇯🇵", "I ❤️ NY", "emoji😀inside", "🤖 robot", "👩🏽‍💻 coder",
    "✅ done ❌ failed", "☕️", "🧑‍🤝‍🧑", "1️⃣ 2️⃣", "🎉🎉🎉",
]
MISC = [
    "", "�", "\u200b", "zero\u200bwidth", "a\u0301", "e\u0308\u0304", "عربي", "עברית", "हिन्दी", "ไทย",
    "\u2028", "©®™", "→ ← ↑ ↓", "∑∫√∞", "ℕℤℚℝ", "ﬁ ﬂ", "\x01\x02", "\x7f", "~`!@#$%^&*()_+-=",
]
SPECIALS = {
    "smollm2": ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<file_sep>"],
    "llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    "spm": ["<s>", "</s>", "<unk>"],
}


def strings_for(model):
    base = PROSE + CODE + NUMBERS + SPACES + ACCENTED + GREEK_CYRILLIC + CJK + EMOJI + MISC
    sp = SPECIALS[model]
    out = list(base)
    out += [f"{s}" for s in sp]
    out += [f"text {s} more" for s in sp]
    out += [f"{sp[0]}user\nhello{sp[1]}\n", f"x{sp[0]}{sp[0]}y", f"<{sp[1]}>", sp[0][:-1], f" {sp[1]} "]
    rng = random.Random(20261201)
    pools = [PROSE, CODE, NUMBERS, SPACES, ACCENTED, GREEK_CYRILLIC, CJK, EMOJI, MISC, sp]
    while len(out) < 330:  # mixtures of the classes
        parts = [rng.choice(rng.choice(pools)) for _ in range(rng.randint(2, 5))]
        joiner = rng.choice(["", " ", "\n", "  ", "\t"])
        out.append(joiner.join(parts))
    seen, uniq = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            uniq.append(s)
    return uniq


# ------------------------------------------------------------- the tiny GGUFs --

CORPUS_EXTRA = [
    "The model reads the prompt and writes an answer. Layers run in ranges across machines.",
    "Residual stream, attention heads, key value cache, rotary position embedding.",
    "the of and to in is that for it as with was on be by this are or his from at which",
]


def corpus():
    lines = []
    for model in ("smollm2", "llama3", "spm"):
        lines += strings_for(model)
    lines += CORPUS_EXTRA * 20
    return [l for l in lines if l]


def write_vocab_gguf(path, model, pre, tokens, types, scores=None, merges=None, bos=None, eos=None,
                     template=None, extra=None):
    w = gguf.GGUFWriter(path, "llama")
    # hyper-parameters llama.cpp reads even for vocab_only
    w.add_context_length(2048)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(16)
    if model is not None:
        w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    if tokens is not None:
        w.add_token_list(tokens)
        w.add_token_types(types)
    if scores is not None:
        w.add_token_scores(scores)
    if merges is not None:
        w.add_token_merges(merges)
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    if template is not None:
        w.add_chat_template(template)
    for k, v in (extra or {}).items():
        w.add_bool(k, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make_llama3_tiny(path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    specials = SPECIALS["llama3"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=1500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[], show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    import json
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    types = [1] * len(tokens)
    for s in specials:
        tokens.append(s)
        types.append(3)
    write_vocab_gguf(path, "gpt2", "llama-bpe", tokens, types, merges=merges,
                     bos=tokens.index("<|begin_of_text|>"), eos=tokens.index("<|end_of_text|>"),
                     template=LLAMA3_TEMPLATE)


def make_spm_tiny(path, workdir):
    import sentencepiece as spm
    text_path = os.path.join(workdir, "spm_corpus.txt")
    with open(text_path, "w", encoding="utf-8") as f:
        for l in corpus():
            f.write(l.replace("\n", " ") + "\n")
    prefix = os.path.join(workdir, "spm_tiny")
    spm.SentencePieceTrainer.train(input=text_path, model_prefix=prefix, vocab_size=900, model_type="bpe",
                                   byte_fallback=True, character_coverage=0.98, hard_vocab_limit=False,
                                   normalization_rule_name="identity", remove_extra_whitespaces=False,
                                   split_digits=True, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    tokens, types, scores = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1)
    write_vocab_gguf(path, "llama", None, tokens, types, scores=[float(x) for x in scores],
                     bos=sp.bos_id(), eos=sp.eos_id(), template=LLAMA2_TEMPLATE)


def make_refused(out):
    write_vocab_gguf(os.path.join(out, "no_tokenizer.gguf"), None, None, None, None)
    write_vocab_gguf(os.path.join(out, "unknown_model.gguf"), "bert", None, ["[PAD]", "a", "b"], [3, 1, 1])
    write_vocab_gguf(os.path.join(out, "unknown_pre.gguf"), "gpt2", "qwen2", ["a", "b", "ab"], [1, 1, 1],
                     merges=["a b"])


# ------------------------------------------------------------------- goldens --

CONVERSATIONS = {
    "two_turns": [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
        {"role": "user", "content": "And of Italy?"},
    ],
    "system_two_turns": [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Colour of the sky?"},
        {"role": "assistant", "content": " Blue. "},
        {"role": "user", "content": "And grass?"},
    ],
}


def main():
    import llama_cpp
    os.makedirs(OUT, exist_ok=True)
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        make_llama3_tiny(os.path.join(OUT, "llama3_tiny.gguf"))
        make_spm_tiny(os.path.join(OUT, "spm_tiny.gguf"), tmp)
    make_refused(OUT)
    models = {
        "smollm2": SMOLLM2,
        "llama3": os.path.join(OUT, "llama3_tiny.gguf"),
        "spm": os.path.join(OUT, "spm_tiny.gguf"),
    }
    gold, chat = [], []
    for name, path in models.items():
        llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        for s in strings_for(name):
            b = s.encode("utf-8")
            for add, special in ((0, 0), (1, 1)):
                ids = llm.tokenize(b, add_bos=bool(add), special=bool(special))
                gold.append(f"{name}\t{add}\t{special}\t{b.hex()}\t{','.join(map(str, ids))}")
        reader = gguf.GGUFReader(path)
        template = reader.fields["tokenizer.chat_template"].contents()
        tokens = reader.fields["tokenizer.ggml.tokens"].contents()
        bos = tokens[int(reader.fields["tokenizer.ggml.bos_token_id"].contents())]
        eos = tokens[int(reader.fields["tokenizer.ggml.eos_token_id"].contents())]
        # as transformers' apply_chat_template (and llama-cpp-python's formatter) set it up
        env = jinja2.Environment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True)

        def raise_exception(msg):
            raise RuntimeError(msg)

        for conv_name, conv in CONVERSATIONS.items():
            text = env.from_string(template).render(messages=conv, add_generation_prompt=True, bos_token=bos,
                                                   eos_token=eos, raise_exception=raise_exception)
            ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
            chat.append(f"{name}\t{conv_name}\t{text.encode('utf-8').hex()}\t{','.join(map(str, ids))}")
        print(f"{name}: {len(strings_for(name))} strings, vocab {llm.n_vocab()}", file=sys.stderr)
    with open(os.path.join(OUT, "goldens.tsv"), "w") as f:
        f.write("\n".join(gold) + "\n")
    with open(os.path.join(OUT, "chat.tsv"), "w") as f:
        f.write("\n".join(chat) + "\n")


if __name__ == "__main__":
    main()
