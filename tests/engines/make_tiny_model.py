"""Build the tiny random-weight Llama that the real vLLM serves in tests.

Run it with the vLLM venv's python (it needs torch, transformers and tokenizers):

    .engines/vllm/bin/python tests/engines/make_tiny_model.py OUTDIR [--crashing]

The model is a 2-layer Llama with random weights (about 1 MB in bfloat16) and a byte-level
BPE tokenizer trained here on a small built-in corpus, so nothing is downloaded. The output
is deterministic: fixed seeds, a fixed corpus. It answers with gibberish, which is all the
tests need: real scheduling, real tokens, real metrics.

`--crashing` builds the same model with 8 attention heads (head_dim 16). vLLM's CPU attention
does not support that: the server starts, then its engine dies on the first request and the
server shuts itself down. A real engine crash, for failover tests.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

try:
    from transformers import LlamaConfig
except ImportError:  # some transformers builds only expose it from the submodule
    from transformers.models.llama.configuration_llama import LlamaConfig

VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>"]  # trained first, so ids 0, 1, 2
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<s>{{ message['role'] }}: {{ message['content'] }}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)

CORPUS_WORDS = [
    "the",
    "gpu",
    "fleet",
    "serves",
    "models",
    "on",
    "vllm",
    "triton",
    "and",
    "tensorrt",
    "engines",
    "while",
    "the",
    "operator",
    "watches",
    "latency",
    "tokens",
    "requests",
    "queues",
    "memory",
    "power",
    "temperature",
    "and",
    "errors",
    "across",
    "nodes",
    "deployments",
    "routes",
    "and",
    "jobs",
    "a",
    "failover",
    "moves",
    "traffic",
    "from",
    "one",
    "engine",
    "to",
    "another",
    "without",
    "dropping",
    "a",
    "request",
    "the",
    "drill",
    "rebuilds",
    "an",
    "engine",
    "and",
    "checks",
    "it",
    "before",
    "promotion",
]


def corpus(lines: int = 400) -> list[str]:
    """A fixed pseudo-random text corpus: deterministic without depending on `random`."""
    out = []
    n = len(CORPUS_WORDS)
    for i in range(lines):
        words = [CORPUS_WORDS[(i * 7 + j * 13 + (i * j) % 5) % n] for j in range(12)]
        out.append(" ".join(words) + f" {i} {i * 31 % 1000}.")
    return out


def build_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=512,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(attention_heads: int = 2) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=attention_heads,  # 2: head_dim 64; vLLM's CPU attention needs >= 32
        num_key_value_heads=1,
        max_position_embeddings=512,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(torch.bfloat16).eval()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--crashing", action="store_true", help="head_dim 16: vLLM dies on use")
    args = parser.parse_args(argv)
    tokenizer = build_tokenizer()
    if len(tokenizer) > VOCAB_SIZE:
        raise SystemExit(f"tokenizer has {len(tokenizer)} tokens, more than {VOCAB_SIZE}")
    args.outdir.mkdir(parents=True, exist_ok=True)
    model = build_model(attention_heads=8 if args.crashing else 2)
    model.save_pretrained(args.outdir, safe_serialization=True)
    tokenizer.save_pretrained(args.outdir)
    print(args.outdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
