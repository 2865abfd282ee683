"""The demo model as GGUF, for llama.cpp: a converter from the tiny Hugging Face Llama that
``tunebench demo-model`` writes (safetensors, byte-level BPE ``tokenizer.json``) to one GGUF file.

It follows llama.cpp's ``convert_hf_to_gguf.py`` for a Llama with a GPT-2-style BPE tokenizer,
cut down to what the demo model has:

- **Weights.** The 2-D matrices are copied bit for bit as BF16 (the model is stored in BF16, so
  nothing is rounded); norms become F32, as llama.cpp requires for 1-D tensors. The query and key
  projections are permuted (``LlamaModel.permute``): Hugging Face rotates halves of each head,
  llama.cpp's Llama rotates interleaved pairs.
- **Tokenizer.** ``tokenizer.ggml.model = "gpt2"`` (byte-level BPE), the tokens in id order
  (padded with ``[PAD<i>]`` tokens of type UNUSED up to the model's vocabulary size, as the
  converter does), token types (added special tokens are CONTROL), the merges as ``"a b"``
  strings, BOS/EOS/UNK ids, and ``tokenizer.ggml.pre = "gpt-2"``: the demo tokenizer's
  pre-tokenizer is ``ByteLevel(use_regex=True)``, whose split regex is GPT-2's, which is what
  llama.cpp's ``gpt-2`` pre-tokenizer type applies (spelled with the hyphen: llama.cpp refuses
  ``gpt2`` there with "unknown pre-tokenizer type", and ``default`` splits differently). No BOS
  is added (``add_bos_token = false``): the Hugging Face tokenizer adds none either, so both
  engines see the same prompt tokens.
- The chat template travels as ``tokenizer.chat_template``.

**Quantization.** ``quantize_file`` writes a 16-bit GGUF's layer matrices in one of llama.cpp's
block types (``q8_0``, ``q4_0``: the ``gguf`` package quantizes them, not the K-quants), keeping
the norms, the embedding and the output head as they are and copying the metadata with the new
file type: what ``weights_dtype`` serves on llama.cpp.

Run as a script by the llama.cpp runtime's interpreter, which has ``gguf`` and ``numpy``:
``python llamacpp_gguf.py SRC_DIR OUT.gguf``, or ``python llamacpp_gguf.py --quantize SRC.gguf
OUT.gguf q4_0``. It imports nothing from tunebench (the engine's venv
does not have it), and its output is deterministic: the same model gives the same bytes.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

GGUF_PRE_TOKENIZER = "gpt-2"
"""llama.cpp's name of the GPT-2 split regex (``LLAMA_VOCAB_PRE_TYPE_GPT2``; ``convert_hf_to_gguf.py``
writes it for GPT-2's tokenizer)."""

TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_UNUSED = 1, 3, 5
"""GGUF token types (``gguf.TokenType``; fixed by the format), so this module's pure parts need no gguf."""

_HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER_TO_GGUF = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_tensor_name(hf_name: str) -> str:
    """The GGUF name of a Hugging Face Llama tensor (``model.layers.0.mlp.up_proj.weight`` ->
    ``blk.0.ffn_up.weight``)."""
    if hf_name in _HF_TO_GGUF:
        return _HF_TO_GGUF[hf_name]
    parts = hf_name.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in _LAYER_TO_GGUF:
        return f"blk.{int(parts[2])}.{_LAYER_TO_GGUF[parts[3]]}"
    raise ValueError(f"tensor {hf_name} has no GGUF name in a Llama model")


def read_safetensors(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    """name -> (dtype, shape, raw bytes) from a safetensors file (its header is JSON)."""
    data = path.read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    base = 8 + header_len
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        out[name] = (info["dtype"], list(info["shape"]), data[base + start:base + end])
    return out


def permute_heads(weights: Any, n_head: int) -> Any:
    """convert_hf_to_gguf's ``LlamaModel.permute``: within each head, rows ordered as two
    halves become interleaved pairs (works on any dtype: it only moves rows)."""
    rows = weights.shape[0]
    return (weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def vocab_from_tokenizer(tokenizer: dict[str, Any], vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens in id order, their GGUF token types, merges as "a b") of a byte-level BPE
    ``tokenizer.json``; ids the tokenizer does not use become ``[PAD<i>]`` (UNUSED)."""
    model = tokenizer["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"only a BPE tokenizer converts to the gpt2 GGUF vocabulary, not {model.get('type')}")
    pre = tokenizer.get("pre_tokenizer") or {}
    if pre.get("type") != "ByteLevel" or not pre.get("use_regex", True) or pre.get("add_prefix_space"):
        raise ValueError(f"pre-tokenizer {pre} is not GPT-2's ByteLevel split (the '{GGUF_PRE_TOKENIZER}' type)")
    by_id = {int(i): tok for tok, i in model["vocab"].items()}
    special = {int(t["id"]): t["content"] for t in tokenizer.get("added_tokens", []) if t.get("special")}
    by_id.update(special)
    if by_id and max(by_id) >= vocab_size:
        raise ValueError(f"the tokenizer has ids up to {max(by_id)}, beyond the model's vocabulary of {vocab_size}")
    tokens, types = [], []
    for i in range(vocab_size):
        if i in special:
            tokens.append(special[i])
            types.append(TOKEN_CONTROL)
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(TOKEN_NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(TOKEN_UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, types, merges


def convert(src: Path, out: Path) -> dict[str, Any]:
    """Write ``src`` (a Hugging Face Llama folder) as one GGUF file ``out``; returns a summary."""
    import gguf
    import numpy as np

    assert (TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_UNUSED) == (gguf.TokenType.NORMAL, gguf.TokenType.CONTROL,
                                                           gguf.TokenType.UNUSED)
    config = json.loads((src / "config.json").read_text())
    if config.get("model_type") != "llama":
        raise ValueError(f"only Llama models convert here, not {config.get('model_type')}")
    tokenizer = json.loads((src / "tokenizer.json").read_text())
    n_head, n_kv = int(config["num_attention_heads"]), int(config.get("num_key_value_heads") or config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    head_dim = int(config.get("head_dim") or hidden // n_head)
    vocab_size = int(config["vocab_size"])
    rope = config.get("rope_parameters") or {}
    rope_theta = float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    if rope.get("rope_type", "default") != "default" or config.get("rope_scaling"):
        raise ValueError("rope scaling is not converted here")

    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name(src.name)
    writer.add_context_length(int(config["max_position_embeddings"]))
    writer.add_embedding_length(hidden)
    writer.add_block_count(int(config["num_hidden_layers"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_rope_freq_base(rope_theta)
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    writer.add_rope_dimension_count(head_dim)
    if head_dim != hidden // n_head:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_vocab_size(vocab_size)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)

    tokens, types, merges = vocab_from_tokenizer(tokenizer, vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(GGUF_PRE_TOKENIZER)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for key, add in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id)):
        if isinstance(config.get(key), int):
            add(int(config[key]))
    if "<unk>" in tokens:
        writer.add_unk_token_id(tokens.index("<unk>"))
    writer.add_add_bos_token(False)
    template = src / "chat_template.jinja"
    if template.is_file():
        writer.add_chat_template(template.read_text())

    tensors = read_safetensors(src / "model.safetensors")
    if config.get("tie_word_embeddings") and "lm_head.weight" not in tensors:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    n_bytes = 0
    for name in sorted(tensors, key=_tensor_order):
        dtype, shape, raw = tensors[name]
        if dtype != "BF16":
            raise ValueError(f"tensor {name} is {dtype}; the demo model is BF16")
        bits = np.frombuffer(raw, dtype=np.uint16).reshape(shape)
        if name.endswith("q_proj.weight"):
            bits = permute_heads(bits, n_head)
        elif name.endswith("k_proj.weight"):
            bits = permute_heads(bits, n_kv)
        gguf_name = gguf_tensor_name(name)
        if bits.ndim == 1:  # norms: llama.cpp wants F32 (BF16 -> F32 is exact: the high 16 bits)
            values = (bits.astype(np.uint32) << 16).view(np.float32)
            writer.add_tensor(gguf_name, values)
            n_bytes += values.nbytes
        else:
            writer.add_tensor(gguf_name, np.ascontiguousarray(bits), raw_dtype=gguf.GGMLQuantizationType.BF16)
            n_bytes += bits.nbytes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"path": str(out), "tensors": len(tensors), "tensor_bytes": n_bytes, "vocab": vocab_size,
            "merges": len(merges)}


def _tensor_order(name: str) -> tuple[int, int, str]:
    """Embeddings first, then layers in numeric order, then the head (as the converter writes)."""
    parts = name.split(".")
    if parts[:2] == ["model", "layers"]:
        return (1, int(parts[2]), name)
    return (0 if "embed" in name else 2, 0, name)


KEPT_16_BIT = ("token_embd.weight", "output.weight")
"""Tensors a quantized file keeps in 16 bits: the embedding (only the batch's rows are read per
step) and the output head, as quantized checkpoints keep them and as the planner counts them."""
SIXTEEN_BIT_TYPES = ("F16", "BF16", "F32")
"""Tensor types a quantization starts from: a file already quantized would be quantized twice."""


def block_quantize(values: Any, type_name: str) -> Any:
    """``values`` (float32, last axis a multiple of the block size) quantized to a llama.cpp block
    type (``q8_0``, ``q4_0``, ...) with the ``gguf`` package: the raw bytes GGUF stores."""
    import gguf

    return gguf.quants.quantize(values, gguf.GGMLQuantizationType[type_name.upper()])


def roundtrip_rms_error(values: Any, type_name: str) -> float:
    """The RMS error of ``values`` quantized to ``type_name`` and back (how much a type loses)."""
    import gguf
    import numpy as np

    restored = gguf.quants.dequantize(block_quantize(values, type_name), gguf.GGMLQuantizationType[type_name.upper()])
    return float(np.sqrt(np.mean((restored - values) ** 2)))


def quantize_file(src: Path, out: Path, type_name: str) -> dict[str, Any]:
    """Write ``src`` (a GGUF whose matrices are 16-bit) to ``out`` with its layers' matrices in
    the block type ``type_name``: the metadata copied (the file type changed), the norms and the
    ``KEPT_16_BIT`` tensors as they are. Deterministic: the same file gives the same bytes."""
    import gguf
    import numpy as np

    qtype = gguf.GGMLQuantizationType[type_name.upper()]
    file_type = gguf.LlamaFileType[f"MOSTLY_{type_name.upper()}"]
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    reader = gguf.GGUFReader(str(src))
    arch_field = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    if arch_field is None:
        raise ValueError(f"{src} has no {gguf.Keys.General.ARCHITECTURE}: not a model GGUF")
    writer = gguf.GGUFWriter(str(out), arch_field.contents(), endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        value = int(file_type) if field.name == gguf.Keys.General.FILE_TYPE else field.contents()
        writer.add_key_value(field.name, value, value_type, sub_type=sub_type)
    if reader.get_field(gguf.Keys.General.FILE_TYPE) is None:
        writer.add_file_type(file_type)
    tensors = []
    quantized = 0
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        if kind not in SIXTEEN_BIT_TYPES:
            raise ValueError(f"tensor {tensor.name} is {kind}: quantize from a 16-bit GGUF, not an already "
                             "quantized one")
        data = tensor.data
        if tensor.name not in KEPT_16_BIT and len(tensor.shape) == 2 and int(tensor.shape[0]) % block == 0:
            values = np.ascontiguousarray(gguf.quants.dequantize(data, tensor.tensor_type), dtype=np.float32)
            data = block_quantize(values, type_name)
            tensors.append((tensor.name, data, qtype))
            quantized += 1
        else:
            tensors.append((tensor.name, data, tensor.tensor_type))
    for name, data, kind in tensors:
        writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _name, data, _kind in tensors:
        writer.write_tensor_data(data, tensor_endianess=reader.endianess)
    writer.close()
    return {"path": str(out), "type": type_name, "tensors": len(tensors), "quantized": quantized,
            "tensor_bytes": sum(int(data.nbytes) for _, data, _ in tensors)}


if __name__ == "__main__":
    if sys.argv[1] == "--quantize":  # --quantize SRC.gguf OUT.gguf TYPE
        print(json.dumps(quantize_file(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])))
    else:
        print(json.dumps(convert(Path(sys.argv[1]), Path(sys.argv[2]))))
