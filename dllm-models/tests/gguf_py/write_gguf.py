#!/usr/bin/env python3
"""GGUF files written by llama.cpp's own Python tooling (the `gguf` package, llama.cpp's gguf-py),
for dllm-models' tests/it/gguf_py.rs.

vocab HF_DIR OUT PRE ARCH
    A vocabulary-only GGUF from the Hugging Face directory HF_DIR (tokenizer.json,
    tokenizer_config.json, config.json), written the way llama.cpp's convert_hf_to_gguf.py writes
    LLaDA (`LLaDAModel`) and Dream (`DreamModel`) vocabularies: their `get_vocab_base` (ids
    missing below config.json's vocab_size become `[PAD{id}]` UNUSED tokens; added tokens CONTROL
    when special, else USER_DEFINED), then `_set_vocab_gpt2` (model `gpt2`, the pre-tokenizer
    name, tokens, types, and gguf-py's `SpecialVocab` for the merges, special ids, add_*_token
    flags and the chat template), and for LLaDA `add_add_bos_token(True)`. The one step not taken
    from the converter is the pre-tokenizer name, PRE: the converter looks it up by a hash of the
    encoded check text, which a tokenizer trained by the test cannot be in.

rewrite IN OUT
    IN's every key-value pair and tensor read with gguf-py's GGUFReader and written again with
    its GGUFWriter (types as read).

The converter's own module imports torch and reads the vocabulary through transformers'
AutoTokenizer; its `get_vocab_base` is restated here over tokenizer.json (what AutoTokenizer
returns for a PreTrainedTokenizerFast: the model's vocabulary and the added tokens).
"""

import json
import sys
from pathlib import Path

import gguf


def vocab(hf_dir: Path, out: Path, pre: str, arch: str) -> None:
    tok = json.loads((hf_dir / "tokenizer.json").read_text(encoding="utf-8"))
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    vocab_dict = dict(tok["model"]["vocab"])
    added = {t["content"]: t for t in tok.get("added_tokens", [])}
    for content, t in added.items():
        vocab_dict[content] = t["id"]
    vocab_size = config.get("vocab_size", len(vocab_dict))
    assert max(vocab_dict.values()) < vocab_size

    # LLaDAModel.get_vocab_base / DreamModel.get_vocab_base
    reverse_vocab = {id_: encoded_tok for encoded_tok, id_ in vocab_dict.items()}
    tokens: list[str] = []
    toktypes: list[int] = []
    for i in range(vocab_size):
        if i not in reverse_vocab:
            tokens.append(f"[PAD{i}]")
            toktypes.append(gguf.TokenType.UNUSED)
        elif reverse_vocab[i] in added:
            tokens.append(reverse_vocab[i])
            if added[reverse_vocab[i]].get("special", False):
                toktypes.append(gguf.TokenType.CONTROL)
            else:
                toktypes.append(gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(reverse_vocab[i])
            toktypes.append(gguf.TokenType.NORMAL)

    writer = gguf.GGUFWriter(str(out), arch)
    # TextModel._set_vocab_gpt2
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(toktypes)
    special_vocab = gguf.SpecialVocab(hf_dir, load_merges=True)
    special_vocab.add_to_gguf(writer)
    if arch == "llada":
        # LLaDAModel.set_vocab
        writer.add_add_bos_token(True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def rewrite(src: Path, out: Path) -> None:
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(out), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        main = field.types[0]
        sub = field.types[-1] if main == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), main, sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_shape=list(reversed(t.shape.tolist())), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    mode = sys.argv[1]
    if mode == "vocab":
        vocab(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], sys.argv[5])
    elif mode == "rewrite":
        rewrite(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(f"unknown mode {mode!r} (vocab or rewrite)")


if __name__ == "__main__":
    main()
