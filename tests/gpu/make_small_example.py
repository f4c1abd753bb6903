#!/usr/bin/env python3
"""Writes the small faithful form of the example model that travels to the GPU machine, and
holds the numpy-only GGUF reader the GPU parity test (tests/gpu/peft_parity.py) loads it with.

The example model, SmolLM2-135M-Instruct Q4_1 (93 MB), is larger than the 64 MiB that can be
carried to the GPU machine. Its token embedding alone is 49152 x 576 = 28.3M values: 57 MB in
bf16, 30 MB in the file's own Q8_0, so an HF folder of bf16 safetensors would hold almost no
layer. This script writes instead a GGUF file with the original tensors, byte for byte, of
  token_embd (Q8_0, tied: also the LM head), output_norm (F32), and blk.0 .. blk.{K-1}
  (Q4_1 projections, F32 norms), with every metadata key of the source (tokenizer, chat
  template, hyper-parameters) and llama.block_count = K,
i.e. SmolLM2-135M-Instruct truncated to its first K of 30 layers (default: the largest K that
keeps the file under --max-mb; K = 8 for 50 MB). The 64 MiB limit counts the whole working tree
that travels (tracked and untracked-not-ignored files, ~20 MB of them in the repository, plus
the carried paths), so the default --max-mb is what is left of 64 MiB after the other files of
`git ls-files -co --exclude-standard` and --reserve-mib (4) for carried paths: K = 4 (40.7 MB)
with the tree of 2026-11-23 (each layer is 2.2 MB; the embedding 30 MB). ftune reads it
directly (tokenizer included); transformers gets the same dequantized weights through
read_gguf/load_gguf_as_hf below, since the GPU machine has no `gguf` package.

Checks run after writing (here, where gguf-py and the CPU ftune exist):
  - every tensor of the small file, dequantized by this reader and by gguf-py, is bit-identical
    to gguf-py's dequantization of the same tensor of the source file (q/k row order undone
    the same way as tests/ref/llama_ref.py);
  - `ftune logits --model SMALL` (CPU) matches tests/ref/llama_ref.py's float64 forward pass
    of the small file within TOL_LOGITS_REL of max |logit|;
  - `ftune tokenize` gives the same ids from the small file as from the source file.

Usage: python3 tests/gpu/make_small_example.py [--out .gpu/smollm2-small] [--layers K]
       [--max-mb MB | --reserve-mib MIB] [--gguf SOURCE]
       (default source: FTUNE_CACHE=/tmp/ftcache if that copy exists, else ~/.cache/ftune,
       through scripts/fetch_example.sh)
Writes OUT/model.gguf and OUT/README.txt.
"""
import struct

import numpy as np

# GGUF metadata value types (formats.md 4.1)
_SCALAR = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
           10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9
# ggml tensor types: (name, block size in values, bytes per block)
GGML_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 30: ("BF16", 1, 2), 8: ("Q8_0", 32, 34),
              2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20)}

_LAYER = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


class _Cursor:
    def __init__(self, buf):
        self.b, self.p = buf, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.b, self.p)
        self.p += struct.calcsize(fmt)
        return v[0]

    def string(self):
        n = self.take("<Q")
        s = bytes(self.b[self.p:self.p + n]).decode("utf-8")
        self.p += n
        return s

    def value(self, vt):
        if vt == _STRING:
            return self.string()
        if vt == _ARRAY:
            et, n = self.take("<I"), self.take("<Q")
            if et == _STRING:
                return [self.string() for _ in range(n)]
            if et not in _SCALAR:
                raise ValueError(f"GGUF array of value type {et} not supported")
            a = np.frombuffer(self.b, dtype=_SCALAR[et], count=n, offset=self.p)
            self.p += a.nbytes
            return a
        if vt not in _SCALAR:
            raise ValueError(f"GGUF value type {vt} at byte {self.p} not supported")
        a = np.frombuffer(self.b, dtype=_SCALAR[vt], count=1, offset=self.p)
        self.p += a.nbytes
        v = a[0].item()
        return bool(v) if vt == 7 else v


def read_gguf(path):
    """(metadata dict, {tensor name: (ggml type id, dims tuple (ne0 first), raw memoryview)})."""
    with open(path, "rb") as f:
        buf = memoryview(f.read())
    c = _Cursor(buf)
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file (magic {bytes(buf[:4])!r})")
    c.p = 4
    version, n_t, n_kv = c.take("<I"), c.take("<Q"), c.take("<Q")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version}")
    meta = {}
    for _ in range(n_kv):
        k = c.string()
        meta[k] = c.value(c.take("<I"))
    infos = []
    for _ in range(n_t):
        name = c.string()
        nd = c.take("<I")
        dims = tuple(c.take("<Q") for _ in range(nd))
        infos.append((name, dims, c.take("<I"), c.take("<Q")))
    align = int(meta.get("general.alignment", 32))
    base = (c.p + align - 1) // align * align
    tensors = {}
    for name, dims, t, off in infos:
        if t not in GGML_TYPES:
            raise ValueError(f"{path}: tensor {name} has ggml type {t}, not supported here")
        _, bs, bb = GGML_TYPES[t]
        n = int(np.prod(dims))
        nbytes = n // bs * bb
        start = base + off
        if n % bs or start + nbytes > len(buf):
            raise ValueError(f"{path}: tensor {name} ({dims}, type {t}) out of bounds")
        tensors[name] = (t, dims, buf[start:start + nbytes])
    return meta, tensors


def dequantize(t, dims, raw):
    """float32 array of numpy shape reversed(dims) (ggml ne0 is the innermost axis)."""
    shape = tuple(int(d) for d in reversed(dims))
    name, bs, bb = GGML_TYPES[t]
    if name == "F32":
        return np.frombuffer(raw, dtype="<f4").reshape(shape).copy()
    if name == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float32).reshape(shape)
    if name == "BF16":
        u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return u.view(np.float32).reshape(shape)
    blk = np.frombuffer(raw, dtype=np.uint8).reshape(-1, bb)
    d = blk[:, 0:2].copy().view("<f2").astype(np.float32)           # (nb, 1)
    if name == "Q8_0":                                               # d, qs[32] int8
        q = blk[:, 2:].copy().view(np.int8).astype(np.float32)
        y = d * q
    else:
        off = 2 if name == "Q4_0" else 4
        qs = blk[:, off:off + 16]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)  # lo: 0..15, hi: 16..31
        if name == "Q4_0":                                           # d, qs: (q - 8) * d
            y = (q - 8.0) * d
        else:                                                        # d, m, qs: q * d + m
            m = blk[:, 2:4].copy().view("<f2").astype(np.float32)
            y = q * d + m
    return y.astype(np.float32).reshape(shape)


def unpermute(w, n_head):
    """GGUF(llama) q/k rows -> HF rows (formats.md 2.4)."""
    hd = w.shape[0] // n_head
    return w.reshape(n_head, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_config(meta):
    """A transformers LlamaConfig dict (config.json) from llama GGUF metadata."""
    a = meta["general.architecture"]
    if a != "llama":
        raise ValueError(f"GGUF arch {a}: only llama here")
    H = int(meta[f"{a}.attention.head_count"])
    C = int(meta[f"{a}.embedding_length"])
    st = meta.get(f"{a}.rope.scaling.type")
    if st not in (None, "none"):
        raise ValueError(f"rope scaling {st} not handled here")
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": int(meta.get(f"{a}.vocab_size", len(meta["tokenizer.ggml.tokens"]))),
        "hidden_size": C,
        "intermediate_size": int(meta[f"{a}.feed_forward_length"]),
        "num_hidden_layers": int(meta[f"{a}.block_count"]),
        "num_attention_heads": H,
        "num_key_value_heads": int(meta.get(f"{a}.attention.head_count_kv", H)),
        "head_dim": int(meta.get(f"{a}.attention.key_length", C // H)),
        "rms_norm_eps": float(meta[f"{a}.attention.layer_norm_rms_epsilon"]),
        "rope_theta": float(meta.get(f"{a}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(meta.get(f"{a}.context_length", 2048)),
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "bos_token_id": int(meta.get("tokenizer.ggml.bos_token_id", 1)),
        "eos_token_id": int(meta.get("tokenizer.ggml.eos_token_id", 2)),
        "tie_word_embeddings": True,  # set from the tensors below
    }


def load_gguf_as_hf(path):
    """(HF config dict, {HF name: float32 ndarray}) of a llama GGUF file."""
    meta, ts = read_gguf(path)
    cfg = hf_config(meta)
    H, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = {}
    for name, (t, dims, raw) in ts.items():
        a = dequantize(t, dims, raw)
        if name == "token_embd.weight":
            w["model.embed_tokens.weight"] = a
        elif name == "output_norm.weight":
            w["model.norm.weight"] = a
        elif name == "output.weight":
            w["lm_head.weight"] = a
        elif name.startswith("blk."):
            _, l, g, kind = name.split(".")
            if g == "attn_q":
                a = unpermute(a, H)
            elif g == "attn_k":
                a = unpermute(a, Hkv)
            w[f"model.layers.{int(l)}.{_LAYER[g]}.{kind}"] = a
        elif name != "rope_freqs.weight":
            raise ValueError(f"{path}: unexpected tensor {name}")
    cfg["tie_word_embeddings"] = "lm_head.weight" not in w
    return cfg, w


# ---------------------------------------------------------------------------------------
# writer (needs gguf-py) and checks

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
TOL_LOGITS_REL = 2e-5  # ftune fp32 vs float64 reference (tests/ref/test_logits_ref.py, deep)
TEXT = "The quick brown fox jumps over the lazy dog. Fine-tuning 135M parameters in C, 2024!"


def fetch_example():
    import os
    import subprocess
    env = dict(os.environ)
    if "FTUNE_CACHE" not in env and os.path.exists("/tmp/ftcache/examples"):
        env["FTUNE_CACHE"] = "/tmp/ftcache"
    p = subprocess.run(["bash", str(ROOT / "scripts" / "fetch_example.sh")], env=env,
                       capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"fetch_example.sh failed: {p.stderr.strip()}")
    return p.stdout.strip().splitlines()[-1]


def tensor_bytes(t):
    return int(t.n_bytes)


def tree_budget_mb(out_dir, margin_mib=4.0):
    """MB (1e6) left for the small model under the 64 MiB that travel to the GPU machine: 64 MiB
    minus the other files that travel with the working tree (git ls-files -co
    --exclude-standard, i.e. tracked and untracked-not-ignored, outside out_dir) minus a margin."""
    import os
    import subprocess
    p = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT,
                       capture_output=True, timeout=60)
    out_rel = os.path.relpath(os.path.abspath(out_dir), ROOT) + os.sep
    other = 0
    for f in p.stdout.decode("utf-8", "replace").split("\0"):
        if f and not f.startswith(out_rel):
            try:
                other += os.path.getsize(ROOT / f)
            except OSError:
                pass
    left = (64.0 - margin_mib) * 2**20 - other
    print(f"tree: {other / 1e6:.1f} MB travel besides {out_rel} -> {left / 1e6:.1f} MB left for the model "
          f"(64 MiB limit, {margin_mib:g} MiB margin)")
    return left / 1e6


def choose_layers(reader, max_mb):
    """Largest K whose file (all non-layer tensors + K layers + metadata) fits max_mb."""
    fixed = sum(tensor_bytes(t) for t in reader.tensors if not t.name.startswith("blk."))
    per = sum(tensor_bytes(t) for t in reader.tensors if t.name.startswith("blk.0."))
    meta = reader.tensors[0].data_offset  # header + metadata + tensor infos (upper bound)
    n = int(reader.fields["llama.block_count"].contents())
    k = int((max_mb * 1e6 - fixed - meta) // per)
    return max(1, min(n, k))


def write_small(src, out_path, K):
    import gguf
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(out_path, arch=arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vt = f.types[0]
        val = f.contents()
        if key == f"{arch}.block_count":
            val = K
        sub = f.types[1] if vt == gguf.GGUFValueType.ARRAY and len(f.types) > 1 else None
        w.add_key_value(key, val, vt, sub_type=sub)
    kept = []
    for t in r.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= K:
            continue
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
        kept.append(t.name)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return kept


def check_tensors(src, small):
    """Bit-identity of every small-file tensor (this reader and gguf-py) with the source's."""
    import gguf
    rs = {t.name: t for t in gguf.GGUFReader(src).tensors}
    rm = {t.name: t for t in gguf.GGUFReader(small).tensors}
    meta, mine = read_gguf(small)
    assert set(mine) == set(rm), "tensor sets differ between the readers"
    H = int(meta["llama.attention.head_count"])
    for name, (t, dims, raw) in mine.items():
        ref = gguf.quants.dequantize(rs[name].data, rs[name].tensor_type).astype(np.float32)
        ref = ref.reshape([int(x) for x in reversed(rs[name].shape)])
        got = dequantize(t, dims, raw)
        via = gguf.quants.dequantize(rm[name].data, rm[name].tensor_type).astype(np.float32)
        assert got.shape == ref.shape, (name, got.shape, ref.shape)
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), f"{name}: reader differs"
        assert np.array_equal(via.reshape(ref.shape).view(np.uint32), ref.view(np.uint32)), name
    # HF layout: the un-permuted q rows equal llama_ref's
    cfg, w = load_gguf_as_hf(small)
    import sys
    sys.path.insert(0, str(ROOT / "tests" / "ref"))
    import llama_ref as R
    rcfg, rw = R.load_gguf(small)
    assert set(w) == set(rw), set(w) ^ set(rw)
    for k in w:
        assert np.array_equal(w[k], rw[k]), f"{k}: differs from llama_ref.load_gguf"
    print(f"tensors: {len(mine)} bit-identical to the source (this reader, gguf-py, llama_ref); "
          f"HF config: {cfg['num_hidden_layers']} layers, heads {H}/{cfg['num_key_value_heads']}, "
          f"tied {cfg['tie_word_embeddings']}")
    return cfg, w, rcfg, rw


def ftune(args):
    import os
    import subprocess
    b = os.environ.get("FTUNE_BIN") or str(ROOT / "build" / "ftune")
    p = subprocess.run([b] + [str(a) for a in args], capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"ftune {' '.join(map(str, args[:2]))} failed: {p.stderr.strip()}")
    return p.stdout


def check_ftune(src, small, rcfg, rw, tmp):
    import json
    import os
    import sys
    sys.path.insert(0, str(ROOT / "tests" / "ref"))
    import llama_ref as R
    ids_small = json.loads(ftune(["tokenize", "--model", small, "--text", TEXT]))["ids"]
    ids_src = json.loads(ftune(["tokenize", "--model", src, "--text", TEXT]))["ids"]
    assert ids_small == ids_src, f"tokenizer differs: {ids_small} vs {ids_src}"
    out = os.path.join(tmp, "logits.f32")
    j = json.loads(ftune(["logits", "--model", small, "--device", "cpu", "--ids",
                          ",".join(map(str, ids_small)), "--out", out]))
    got = np.fromfile(out, dtype="<f4").reshape(len(ids_small), -1)
    ref = R.forward(rcfg, rw, ids_small)
    err = float(np.abs(got - ref).max())
    scale = float(np.abs(ref).max())
    loss = R.next_token_loss(ref, ids_small)
    print(f"ftune logits (CPU) vs llama_ref float64, {len(ids_small)} tokens: max |diff| "
          f"{err:.3e} = {err / scale:.2e} of max |logit| {scale:.2f} (bound {TOL_LOGITS_REL:.0e}); "
          f"loss ftune {j['loss']:.6f} vs ref {loss:.6f}")
    assert err <= TOL_LOGITS_REL * scale, "ftune logits differ from the reference"
    return err / scale, loss


def main():
    import argparse
    import hashlib
    import os
    import tempfile
    import gguf
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", help="source GGUF (default: scripts/fetch_example.sh)")
    ap.add_argument("--out", default=str(ROOT / ".gpu" / "smollm2-small"))
    ap.add_argument("--layers", type=int, help="K (default: the largest under --max-mb)")
    ap.add_argument("--max-mb", type=float, help="largest file (default: what the 64 MiB tree limit leaves)")
    ap.add_argument("--reserve-mib", type=float, default=4.0,
                    help="room kept free under the 64 MiB for carried paths (default 4)")
    ap.add_argument("--no-check", action="store_true", help="skip the checks")
    a = ap.parse_args()
    src = a.gguf or fetch_example()
    r = gguf.GGUFReader(src)
    n_layers = int(r.fields["llama.block_count"].contents())
    K = a.layers or choose_layers(r, a.max_mb or tree_budget_mb(a.out, a.reserve_mib))
    del r
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "model.gguf")
    kept = write_small(src, path, K)
    size = os.path.getsize(path)
    print(f"wrote {path}: {K} of {n_layers} layers, {len(kept)} tensors, {size / 1e6:.1f} MB")
    note = ""
    if not a.no_check:
        with tempfile.TemporaryDirectory() as tmp:
            _, _, rcfg, rw = check_tensors(src, path)
            rel, loss = check_ftune(src, path, rcfg, rw, tmp)
        note = (f"Checked when written: tensors bit-identical to the source's (numpy reader, gguf-py, "
                f"llama_ref); ftune logits (CPU) vs llama_ref float64 max rel error {rel:.2e}; "
                f"reference loss of the check text {loss:.4f}.\n")
    sha = hashlib.sha256(open(src, "rb").read()).hexdigest()
    with open(os.path.join(a.out, "README.txt"), "w") as f:
        f.write(f"SmolLM2-135M-Instruct (Q4_1 GGUF) truncated to its first {K} of {n_layers} layers, "
                f"for the GPU parity test (tests/gpu/peft_parity.py).\n"
                f"Source: {os.path.basename(src)} sha256 {sha}\n"
                f"model.gguf: {size} bytes; tensors copied byte for byte (token_embd Q8_0 tied, "
                f"output_norm, blk.0-{K - 1}); all metadata copied, llama.block_count = {K}.\n"
                f"Written by: python3 tests/gpu/make_small_example.py --layers {K} --out {os.path.relpath(a.out, ROOT)}\n"
                + note)
    print(f"total {sum(os.path.getsize(os.path.join(a.out, x)) for x in os.listdir(a.out)) / 1e6:.1f} MB in {a.out}")


if __name__ == "__main__":
    main()
