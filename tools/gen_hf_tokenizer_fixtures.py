#!/usr/bin/env python3
"""Write tests/fixtures/tokenizers/: tiny Hugging Face tokenizers and what HF makes of them.

No model hub is reachable from the project's machines, so the tokenizers are trained here, with the
`tokenizers` library, on a few State of the Union speeches (public domain; scripts/fetch_data.sh
puts them in .cache/data/sotu) plus a short multilingual paragraph:

  gpt2_bpe/     byte-level BPE, ByteLevel pre-tokenizer (GPT-2 regex), merges in the legacy
                "a b" string form, <|endoftext|>; also vocab.json + merges.txt (the GPT-2 file pair)
  llama3_bpe/   Sequence[Split(Llama-3 regex), ByteLevel(use_regex=false)], ignore_merges, BOS added
                by a TemplateProcessing post-processor, Llama-3 special tokens, the Llama-3 chat template
  qwen2_bpe/    NFC normalizer, Split(Qwen2 regex) + ByteLevel, ChatML special tokens and the Qwen2
                chat template (ChatML with a default system prompt)
  spm/          a SentencePiece BPE model with byte fallback (LLaMA-2 layout: <unk>=0 <s>=1 </s>=2)
  bert_wordpiece/  WordPiece as bert-base-uncased: BertNormalizer, BertPreTokenizer, "##" subwords,
                max_input_chars_per_word, WordPiece decoder, [CLS] A [SEP] / [CLS] A [SEP] B [SEP]
                TemplateProcessing; bert_wordpiece_cased/ the same without lowercasing, accents
                kept, and a BertProcessing post-processor

and cases.json: for each folder and each tricky string, the ids AutoTokenizer.from_pretrained(folder)
gives (transformers 5.x), with and without special tokens, and the decoded text; plus the ids of the
real GPT-2 tokenizer (.cache/data/gpt2) and chat templates rendered by apply_chat_template.

    /tmp/dsvenv/bin/python tools/gen_hf_tokenizer_fixtures.py   # tokenizers, transformers, sentencepiece

and wordpiece_cases.json: for the WordPiece folders, single texts and pairs, the ids, token type ids
and decoded text the `tokenizers` library gives (checked against AutoTokenizer too).

    /tmp/dsvenv/bin/python tools/gen_hf_tokenizer_fixtures.py --only wordpiece   # tokenizers, transformers

rewrites just the WordPiece folders and wordpiece_cases.json (no sentencepiece needed).

The C++ tests (tests/test_hf_tokenizer.cpp, tests/test_chat_template.cpp) never run Python.
"""
import json
import os
import pathlib
import shutil
import sys
import tempfile

import tokenizers
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "tokenizers"
CACHE = pathlib.Path(os.environ.get("DS_CACHE_DIR", ROOT / ".cache" / "data"))

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Chat templates as published (Meta-Llama-3-8B-Instruct; Qwen2-7B-Instruct; the ChatML template of
# the transformers docs). src/data/chat_template.cpp recognises these sources.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}")

# Our Jinja for the two formats that publish none (the same text as src/data/chat_template.cpp).
CHATGLM_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ '[Round ' ~ (loop.index0 // "
    "2) ~ ']\\n问：' ~ message['content'] ~ '\\n答：' }}{% elif message['role'] == 'assistant' %}{{ "
    "message['content'] }}{% if loop.last %}{{ eos_token }}{% else %}{{ '\\n' }}{% endif %}{% else "
    "%}{{ raise_exception('chatglm: roles must be user/assistant') }}{% endif %}{% endfor %}")
ALPACA_TEMPLATE = (
    "{% set ns = namespace(system=none, instruction='', input=none, output=none) %}{% for m in "
    "messages %}{% if m['role'] == 'system' %}{% set ns.system = m['content'] %}{% elif m['role'] "
    "== 'user' %}{% set ns.instruction = m['content'] %}{% elif m['role'] == 'input' %}{% set "
    "ns.input = m['content'] %}{% elif m['role'] == 'assistant' %}{% set ns.output = m['content'] "
    "%}{% endif %}{% endfor %}{% if ns.system is none %}{% if ns.input is none %}{% set ns.system = "
    "'Below is an instruction that describes a task. Write a response that appropriately completes "
    "the request.' %}{% else %}{% set ns.system = 'Below is an instruction that describes a task, "
    "paired with an input that provides further context. Write a response that appropriately "
    "completes the request.' %}{% endif %}{% endif %}{{ ns.system ~ '\\n\\n### Instruction:\\n' ~ "
    "ns.instruction }}{% if ns.input is not none %}{{ '\\n\\n### Input:\\n' ~ ns.input }}{% endif "
    "%}{{ '\\n\\n### Response:' }}{% if ns.output is not none %}{{ ns.output ~ eos_token }}{% endif %}")

MULTILINGUAL = """
Naïve café owners in Zürich serve crème brûlée; the façade is résumé-worthy. Ça va très bien.
你好，世界！我们今天学习自然语言处理。東京は日本の首都です。こんにちは、元気ですか？
안녕하세요, 반갑습니다. Привет, мир! Как дела? Γειά σου Κόσμε. مرحبا بالعالم. שלום עולם.
नमस्ते दुनिया। Emoji: 👍🏽 😀 🎉 👨‍👩‍👧‍👦 🇫🇷 ❤️. Numbers: 1234567, 3.14159, ٣٤٥, ½, ², Ⅻ.
def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # comment\n\tindented\r\n
I'm sure you're right; he'll say they've done what we'd planned. IT'S DONE. You'RE welcome.
"""

CASES = [
    "Hello world",
    "",
    " ",
    "   ",
    " leading space",
    "trailing space ",
    "multiple   spaces    between  words",
    "tabs\tand\nnewlines\r\nand\n\n\nblank lines\n",
    "  \n  \n indented\n\tcode",
    "I'm you're he'll they've we'd it's don't",
    "I'M YOU'RE HE'LL THEY'VE WE'D IT'S DON'T",
    "'s 't 're 've 'm 'll 'd ''quoted''",
    "numbers 1234567 and 3.14159 and 1,000,000 and 007",
    "12345678901234567890",
    "Arabic-Indic ٣٤٥٦ and ½ ² Ⅻ ①",
    "naïve café résumé Zürich crème brûlée",
    "decomposed e\u0301 and a\u0308 (NFC composes them)",
    "你好，世界！自然语言处理",
    "こんにちは世界、東京",
    "안녕하세요 반갑습니다",
    "Привет мир, Γειά σου Κόσμε",
    "مرحبا بالعالم שלום עולם",
    "नमस्ते दुनिया",
    "emoji 👍🏽 😀🎉 👨‍👩‍👧‍👦 🇫🇷 ❤️",
    "def f(x):\n    return x ** 2  # square\n",
    "URL https://example.com/path?q=1&r=2#frag",
    "!!!???... ---- **** ((()))",
    "nbsp\u00a0and\u3000ideographic\u2003em space",
    "zero\u200bwidth joiner",
    "mixed123abc456DEF",
    "<|endoftext|>",
    "before<|endoftext|>after",
    "<|begin_of_text|>Hello<|eot_id|>",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "a<|im_start|>b<|im_end|>c",
    "<s>Hello</s> <unk>",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Fellow-Citizens of the Senate and of the House of Representatives:",
    "ſt long s and ǅ titlecase and İstanbul",
    "recent letters a\U00011DB0\U00011DB1b \uA7CE x\U000323B0 (Oniguruma: not letters)",
]


def random_cases(n=80, seed=1234):
    """Random strings over characters that exercise every regex alternative's edges."""
    import random
    rng = random.Random(seed)
    alphabet = (list("aZé'sStTdDmMlLrRvVeE") + ["'", "'", " ", " ", "  ", "\t", "\n", "\r\n", "\r",
                "\u00a0", "\u3000", "\u2003", "1", "23", "4567", "٣", "½", "Ⅻ", ".", ",", "!?", "-",
                "你", "好", "こ", "한", "\u0301", "\u200b", "👍", "🏽", "\u200d", "ſ", "İ", "ǅ", "<|im_start|>",
                "<|endoftext|>", "<|eot_id|>", "<s>"])
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24))) for _ in range(n)]


CASES += random_cases()

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": " Hello, how can I help? "},
     {"role": "user", "content": "Tell me a joke.\n"}, {"role": "assistant", "content": "No.\n"}],
    [{"role": "user", "content": "你好"}, {"role": "assistant", "content": "你好！👋"}],
]


def corpus():
    sotu = CACHE / "sotu"
    if not sotu.is_dir():
        sys.exit(f"missing {sotu}: run scripts/fetch_data.sh first")
    files = sorted(sotu.glob("*.txt"))
    picks = [f for f in files if f.name.startswith(("1790", "1861", "1933", "1961", "2001"))]
    return [f.read_text(encoding="utf-8") for f in picks] + [MULTILINGUAL] * 20


def train_bpe(pre_tokenizer, normalizer, vocab_size, special, ignore_merges):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def save_fast(tok, folder, config):
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", **config}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def make_gpt2(folder):
    tok = train_bpe(pre_tokenizers.ByteLevel(add_prefix_space=False), None, 700, ["<|endoftext|>"],
                    False)
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    save_fast(tok, folder, {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                            "model_max_length": 1024})
    # The legacy form of merges ("a b" strings), still read by tokenizers and by us.
    data = json.loads((folder / "tokenizer.json").read_text())
    data["model"]["merges"] = [" ".join(pair) for pair in data["model"]["merges"]]
    (folder / "tokenizer.json").write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    # The GPT-2 file pair, for load_tokenizer on a folder holding only vocab.json + merges.txt.
    pair = folder / "vocab_merges"
    pair.mkdir(exist_ok=True)
    (pair / "vocab.json").write_text(json.dumps(data["model"]["vocab"], ensure_ascii=False) + "\n")
    (pair / "merges.txt").write_text("#version: 0.2\n" + "\n".join(data["model"]["merges"]) + "\n")
    # The file pair alone does not load in transformers 5 (docs/tokenizers.md): name the class.
    (pair / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>",
         "eos_token": "<|endoftext|>"}, indent=2) + "\n")


def make_llama3(folder):
    special = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
               "<|eot_id|>"]
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = train_bpe(pre, None, 800, special, True)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    save_fast(tok, folder, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                            "model_max_length": 8192, "chat_template": LLAMA3_TEMPLATE})


def make_qwen2(folder):
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = train_bpe(pre, normalizers.NFC(), 800, special, False)
    save_fast(tok, folder, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                            "model_max_length": 32768, "chat_template": QWEN2_TEMPLATE})


def make_spm(folder):
    import sentencepiece as spm
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        text = pathlib.Path(tmp) / "corpus.txt"
        text.write_text("\n".join(line for doc in corpus() for line in doc.split(". ")))
        spm.SentencePieceTrainer.train(
            input=str(text), model_prefix=str(pathlib.Path(tmp) / "m"), model_type="bpe",
            vocab_size=600, byte_fallback=True, character_coverage=0.9995,
            normalization_rule_name="identity", remove_extra_whitespaces=False,
            add_dummy_prefix=True, split_digits=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
            num_threads=1, minloglevel=2)
        shutil.copy(pathlib.Path(tmp) / "m.model", folder / "tokenizer.model")
    cfg = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
           "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False,
           "model_max_length": 4096}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def hf_cases(folder):
    tok = AutoTokenizer.from_pretrained(str(folder))
    out = []
    for text in CASES:
        ids = tok.encode(text, add_special_tokens=False)
        out.append({"text": text, "ids": ids,
                    "ids_with_special": tok.encode(text, add_special_tokens=True),
                    "decoded": tok.decode(ids)})
    info = {"bos": tok.bos_token_id, "eos": tok.eos_token_id, "pad": tok.pad_token_id,
            "vocab_size": len(tok), "class": type(tok).__name__}
    return info, out


ALPACA_CONVERSATIONS = [
    [{"role": "user", "content": "Give three tips for staying healthy."}],
    [{"role": "user", "content": "Give three tips for staying healthy."},
     {"role": "assistant", "content": "1. Eat well.\n2. Sleep.\n3. Move."}],
    [{"role": "user", "content": "Translate to French."}, {"role": "input", "content": "Good morning"},
     {"role": "assistant", "content": "Bonjour"}],
    [{"role": "system", "content": "You are a translator."}, {"role": "user", "content": "Translate."},
     {"role": "input", "content": "你好"}],
]
CHATGLM_CONVERSATIONS = [
    [{"role": "user", "content": "你好"}],
    [{"role": "user", "content": "你好"}, {"role": "assistant", "content": "你好👋！我是人工智能助手 ChatGLM-6B。"}],
    [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
     {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2"}, {"role": "user", "content": "Q3"}],
]


def chat_cases(folder, template, conversations):
    tok = AutoTokenizer.from_pretrained(str(folder))
    out = []
    for conv in conversations:
        for gen in (False, True):
            text = tok.apply_chat_template(conv, chat_template=template, tokenize=False,
                                           add_generation_prompt=gen)
            out.append({"messages": conv, "add_generation_prompt": gen, "text": text,
                        "ids": tok.encode(text, add_special_tokens=False)})
    return {"tokenizer": folder.name, "jinja": template, "cases": out}


WORDPIECE_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# Text the WordPiece vocabularies learn from, besides the speeches: accents, CJK, punctuation.
WORDPIECE_TEXT = """
The quick brown fox jumps over the lazy dog. Tokenization splits words into word pieces;
unknown words become [UNK]. Running, runner, runs, unbelievable, rethinking, playing, played!
Café, naïve, résumé and Zürich keep their accents in the cased model. What's this? It's BERT's.
"""


def make_wordpiece(folder, lowercase, strip_accents, bert_processing):
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=strip_accents, lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    trainer = trainers.WordPieceTrainer(vocab_size=400, min_frequency=2, special_tokens=WORDPIECE_SPECIAL,
                                        continuing_subword_prefix="##", show_progress=False)
    tok.train_from_iterator(corpus() + [WORDPIECE_TEXT] * 20, trainer=trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    if bert_processing:
        tok.post_processor = processors.BertProcessing(("[SEP]", sep), ("[CLS]", cls))
    else:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    save_fast(tok, folder, {"unk_token": "[UNK]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                            "sep_token": "[SEP]", "mask_token": "[MASK]", "model_max_length": 512,
                            "clean_up_tokenization_spaces": False})


WORDPIECE_CASES = [
    "Hello world",
    "",
    "   ",
    "The quick brown fox jumps over the lazy dog.",
    "UPPERCASE Words And MiXeD cAsE",
    "naïve café résumé Zürich crème brûlée ÀÉÎÕÜ",
    "decomposed e\u0301 and a\u0308",
    "你好，世界！自然语言处理 東京 안녕하세요",
    "Chinese next to latin: abc中文def",
    "punctuation!!! ...?? (brackets) [square] {curly} \"quotes\" 'single' a-b_c",
    "symbols $5 + 3 = 8 ^ ` | ~ < > @ # % & * \\ /",
    "unicode punctuation « guillemets » — dash … ellipsis ¿ ¡ · 、。",
    "control\x00chars\x01and\x7f\u200bzero width\ufeffbom\ufffdreplacement",
    "tabs\tand\nnewlines\r\nand\u00a0nbsp\u3000ideographic\u2003em",
    "unknown words: xyzzyq qwxzv ☃ 👍🏽 🇫🇷",
    "a" * 100,
    "b" * 101 + " short",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "[CLS] spelled [SEP] in [MASK] text [UNK] [PAD]",
    "before[MASK]after",
    "I'm sure you're right; he'll say they've done what we'd planned. Don't!",
    "numbers 1234567 and 3.14159 and 1,000,000",
    "ſt long s and ǅ titlecase and İstanbul ΣΑΣ",
    "Fellow-Citizens of the Senate and of the House of Representatives:",
]

def wordpiece_random_cases(n=60, seed=4321):
    """Random strings over what BertNormalizer and BertPreTokenizer treat specially."""
    import random
    rng = random.Random(seed)
    alphabet = (list("aZeTqxs") + ["the", "ing", "un", "##", "'", ".", ",", "!", "?", "-", "$", "^", "`",
                "|", "~", "«", "»", "—", "…", "、", "。", " ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000",
                "\u2003", "\u0085", "\x00", "\x07", "\x7f", "\u200b", "\u200d", "\ufeff", "\ufffd", "\ue000",
                "é", "É", "e\u0301", "\u0308", "ñ", "Å", "ſ", "İ", "ǅ", "Σ", "ß", "你", "好", "東", "\uf900",
                "\U00020000", "こ", "한", "👍", "🏽", "①", "½", "٣", "[MASK]", "[SEP]", "[CLS]", "[UNK]", "[mask]"])
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 20))) for _ in range(n)]


WORDPIECE_RANDOM = wordpiece_random_cases()
WORDPIECE_CASES += WORDPIECE_RANDOM

WORDPIECE_PAIRS = [
    ("Hello world", "How are you?"),
    ("", "only the second"),
    ("only the first", ""),
    ("Café NAÏVE", "你好，世界！"),
    ("What is the capital of France?", "Paris is the capital of France."),
    ("[MASK] is here", "unknown xyzzyq " + "c" * 120),
] + list(zip(WORDPIECE_RANDOM[:10], WORDPIECE_RANDOM[10:20]))


def wordpiece_cases(folder):
    """Ids, type ids and decoded text from the tokenizers library (and the same ids from AutoTokenizer)."""
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(str(folder))
    singles, pairs = [], []
    for text in WORDPIECE_CASES:
        plain = tok.encode(text, add_special_tokens=False)
        full = tok.encode(text, add_special_tokens=True)
        assert auto.encode(text, add_special_tokens=False) == plain.ids, text
        assert auto.encode(text, add_special_tokens=True) == full.ids, text
        singles.append({"text": text, "ids": plain.ids, "ids_with_special": full.ids,
                        "type_ids_with_special": full.type_ids, "normalized": tok.normalizer.normalize_str(text),
                        "decoded": tok.decode(plain.ids, skip_special_tokens=False),
                        "decoded_with_special": tok.decode(full.ids, skip_special_tokens=False),
                        "decoded_skip_special": tok.decode(full.ids, skip_special_tokens=True)})
    for a, b in WORDPIECE_PAIRS:
        plain = tok.encode(a, b, add_special_tokens=False)
        full = tok.encode(a, b, add_special_tokens=True)
        if a and b:  # transformers takes an empty text as "no pair"
            enc = auto(a, b, return_token_type_ids=True)
            assert enc["input_ids"] == full.ids, (a, b)
            assert enc["token_type_ids"] == full.type_ids, (a, b)
        pairs.append({"a": a, "b": b, "ids": plain.ids, "type_ids": plain.type_ids,
                      "ids_with_special": full.ids, "type_ids_with_special": full.type_ids,
                      "decoded_with_special": tok.decode(full.ids, skip_special_tokens=False)})
    info = {"vocab_size": tok.get_vocab_size(with_added_tokens=True), "unk": tok.token_to_id("[UNK]"),
            "pad": tok.token_to_id("[PAD]"), "cls": tok.token_to_id("[CLS]"),
            "sep": tok.token_to_id("[SEP]")}
    return {"info": info, "cases": singles, "pairs": pairs}


def main_wordpiece():
    folders = {"bert_wordpiece": (True, None, False), "bert_wordpiece_cased": (False, False, True)}
    result = {"generator": "tools/gen_hf_tokenizer_fixtures.py",
              "versions": {"transformers": transformers.__version__,
                           "tokenizers": tokenizers.__version__}, "tokenizers": {}}
    for name, (lowercase, strip_accents, bert_processing) in folders.items():
        if (OUT / name).exists():
            shutil.rmtree(OUT / name)
        make_wordpiece(OUT / name, lowercase, strip_accents, bert_processing)
        result["tokenizers"][name] = wordpiece_cases(OUT / name)
    (OUT / "wordpiece_cases.json").write_text(json.dumps(result, ensure_ascii=False) + "\n")
    print(f"wrote {', '.join(folders)} and wordpiece_cases.json in {OUT}")


def main():
    if sys.argv[1:] == ["--only", "wordpiece"]:
        main_wordpiece()
        return
    import sentencepiece as spm
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    make_gpt2(OUT / "gpt2_bpe")
    make_llama3(OUT / "llama3_bpe")
    make_qwen2(OUT / "qwen2_bpe")
    make_spm(OUT / "spm")

    result = {"generator": "tools/gen_hf_tokenizer_fixtures.py",
              "versions": {"transformers": transformers.__version__,
                           "tokenizers": tokenizers.__version__, "sentencepiece": spm.__version__},
              "tokenizers": {}, "chat": {}}
    for name in ("gpt2_bpe", "gpt2_bpe/vocab_merges", "llama3_bpe", "qwen2_bpe", "spm"):
        folder = OUT / name
        info, cases = hf_cases(folder)
        result["tokenizers"][name] = {"info": info, "cases": cases}
    # SentencePiece's own ids, to compare with AutoTokenizer's (should agree on plain text).
    sp = spm.SentencePieceProcessor(model_file=str(OUT / "spm" / "tokenizer.model"))
    result["tokenizers"]["spm"]["sentencepiece_ids"] = [sp.encode(t) for t in CASES]
    # The real GPT-2 vocabulary (fetched by scripts/fetch_data.sh, not committed): ids only.
    gpt2 = CACHE / "gpt2"
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(gpt2 / "encoder.json", pathlib.Path(tmp) / "vocab.json")
        shutil.copy(gpt2 / "vocab.bpe", pathlib.Path(tmp) / "merges.txt")
        (pathlib.Path(tmp) / "tokenizer_config.json").write_text(
            json.dumps({"tokenizer_class": "GPT2Tokenizer"}))
        info, cases = hf_cases(pathlib.Path(tmp))
    for c in cases:
        del c["decoded"], c["ids_with_special"]
    result["tokenizers"]["gpt2_real"] = {"info": info, "cases": cases}
    result["chat"] = {
        "llama3": chat_cases(OUT / "llama3_bpe", LLAMA3_TEMPLATE, CONVERSATIONS),
        "qwen2": chat_cases(OUT / "qwen2_bpe", QWEN2_TEMPLATE, CONVERSATIONS),
        "chatml": chat_cases(OUT / "qwen2_bpe", CHATML_TEMPLATE, CONVERSATIONS),
        "chatglm": chat_cases(OUT / "gpt2_bpe", CHATGLM_TEMPLATE, CHATGLM_CONVERSATIONS),
        "alpaca": chat_cases(OUT / "gpt2_bpe", ALPACA_TEMPLATE, ALPACA_CONVERSATIONS),
    }
    (OUT / "cases.json").write_text(json.dumps(result, ensure_ascii=False) + "\n")
    main_wordpiece()
    total = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    print(f"wrote {OUT} ({total / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
