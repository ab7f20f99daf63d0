"""The tiny models' tokenizer: a byte-level BPE in the style of Qwen2/Qwen3 (NFC normalizer, Qwen's
pre-tokenizer regex, byte-level alphabet, ChatML special tokens at the end of the vocabulary), trained
with the `tokenizers` library on the fixed text below. 509 ordinary tokens (the 256 bytes + 253
merges) and 3 special ones: 512 in all."""

from __future__ import annotations

from pathlib import Path

# Qwen2's pre-tokenizer (its tokenizer.json `Split` pattern; llama.cpp's `qwen2` pre-type).
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
N_ORDINARY = 509
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 509, 510, 511
VOCAB_SIZE = N_ORDINARY + len(SPECIAL_TOKENS)
EOS = "<|endoftext|>"

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)

TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog. The dog was not amused, and the fox ran into the forest.
A small model can still learn a lot from a little text: the words that come up again and again become
tokens of their own, while the rare ones are spelled out byte by byte.
In the morning the town was quiet. The baker opened the shop at six, the train left the station at
seven, and by eight the streets were full of people going to work, to school, or to the market.
She said: "I've been told it's there, but I'll check again." He asked, "Are you sure? We'd better go."
Numbers: 0 1 2 3 4 5 6 7 8 9 10 12 42 100 256 1024 3.14159 2.71828 1e-6 1,000,000 2024-05-17 12:30.
Questions and answers. What is the capital of France? Paris is the capital of France. What is two plus
two? Two plus two is four. Where does the river go? The river goes down to the sea.
Once upon a time there was a little robot who wanted to write poems. Every night it read the stars,
counted them, and wrote one line for each star it could see through the window of the old lab.

def greet(name: str) -> str:
    \"\"\"Return a friendly greeting for the given name.\"\"\"
    if not name:
        return "Hello, world!"
    return f"Hello, {name}!"


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.value = start

    def increment(self, step: int = 1) -> int:
        self.value += step
        return self.value


for i in range(10):
    print(i, i * i, greet(str(i)))

fn main() {
    let mut total: u64 = 0;
    for (index, value) in values.iter().enumerate() {
        if index % 2 == 0 {
            total += *value as u64;
        }
    }
    println!("total = {}", total);
}

pub struct Config {
    pub hidden_size: usize,
    pub num_heads: usize,
    pub vocab_size: usize,
}

impl Config {
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }
}

{"name": "tiny", "layers": 2, "heads": [4, 2], "rope_theta": 1000000.0, "tied": true, "tags": ["test", "qwen"]}
<html><body><p class="note">Hello &amp; welcome</p></body></html>
SELECT id, name FROM users WHERE age > 21 ORDER BY name ASC LIMIT 10;
x = [1, 2, 3]; y = {k: v for k, v in zip("abc", x)}; assert len(y) == 3
// comment: the function returns the sum of the values
/* block comment */ if (a != b && c <= d || e >= f) { return -1; } else { return 0; }
The weather report said it would rain in the afternoon, so they took their umbrellas and walked
to the library. Inside, the reading room was warm and the only sound was the turning of pages.
Tokens, tensors, layers and heads: the model reads the prompt, computes attention over the past, and
predicts the next token. Then it does it again, one token at a time, until the answer is complete.
Le petit chat dort sur la chaise. Der Hund spielt im Garten. El sol brilla en el cielo. Café, naïve, über.
"""


def build_tokenizer():
    """The trained `tokenizers.Tokenizer` (deterministic: the same text gives the same vocabulary and
    merges)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=N_ORDINARY,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(TRAINING_TEXT.splitlines(keepends=True), trainer=trainer)
    assert tok.get_vocab_size() == N_ORDINARY, f"BPE training gave {tok.get_vocab_size()} tokens"
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == N_ORDINARY + i, t
    return tok


def save_tokenizer(directory: Path):
    """Writes tokenizer.json + tokenizer_config.json (HF's fast tokenizer) into `directory` and
    returns the transformers tokenizer."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(),
        eos_token=EOS,
        pad_token=EOS,
        model_max_length=256,
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(str(directory))
    return hf
