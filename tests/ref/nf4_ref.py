"""Independent numpy reference of bitsandbytes NF4 with double quantization (tests only).

Written from the spec digest /work/shared/reference/formats.md section 5 and the
bitsandbytes sources it cites (functional.py quantize_4bit / quantize_blockwise /
create_dynamic_map / QuantState.as_dict, csrc/kernels.cu kQuantizeBlockwise, dQuantizeNF4,
dQuantize<0>, kDequantizeBlockwise), without any ftune code. All arithmetic is fp32 numpy
in the order the CUDA kernels use:

  quantize_4bit(A, blocksize=64, compress_statistics=True, quant_type="nf4"):
    absmax[b] = max |A[b*64 : b*64+64]|;  v = A * float32(1 / absmax[b])
    q = number of NF4 thresholds t with v > t (NaN -> 0);  byte = q[2j] << 4 | q[2j+1]
    offset = mean(absmax)            (here: fp32(math.fsum(absmax) / n), see below)
    nested: quantize_blockwise(absmax - offset, dynamic map, blocksize=256) with the CUDA
            kernel's dQuantize<0> binary search (pivot 127, fp32 midpoints)
  dequantize: absmax = map[qabsmax] * nested_absmax[b // 256] + offset (two fp32 roundings)
              W = NF4[q] * absmax

Deviations from a bitsandbytes run, the same ones ftune makes (nf4.h):
  - IEEE 1/absmax where bnb's CUDA build (--use_fast_math) uses an approximate reciprocal;
  - the offset is the correctly rounded mean (math.fsum) where bnb uses torch's fp32 mean.

create_dynamic_map: torch's fp32 linspace computes start + step * i as one fused
multiply-add (the published bnb map only agrees with that form); here the product is
formed exactly in float64 (a 24-bit step times an integer below 2^7 fits in 53 bits, and
so does the sum with 0.1f or 1.0f), so one rounding to float32 gives the fused result.

Also: the bnb 4-bit safetensors layout (formats.md 5.5) for writing pre-quantized
checkpoints the way transformers + bitsandbytes save them, and a reader of ftune's pack
file format (offload/pack.h) used by test_nf4_ref.py.
"""
import json
import math
import struct

import numpy as np

F32 = np.float32

NF4_CODE = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=F32)

# dQuantizeNF4's thresholds: the kernel's decimal float literals ("...f"), each rounded
# directly to the nearest fp32 (as nvcc converts a literal). Done exactly with fractions:
# np.float32(float(s)) would round twice (decimal -> double -> fp32) and four of these
# literals are exact code midpoints, where the double rounding lands one ulp off.
NF4_THRESHOLD_LITERALS = [
    "-0.8480964004993439", "-0.6106329262256622", "-0.4599952697753906", "-0.33967943489551544",
    "-0.23460740596055984", "-0.13791173323988914", "-0.045525018125772476", "0.03979014977812767",
    "0.1202552504837513", "0.2035212516784668", "0.2920137718319893", "0.3893125355243683",
    "0.5016634166240692", "0.6427869200706482", "0.8614784181118011"]


def f32_from_decimal(s):
    """The fp32 nearest to the decimal string s (ties to even), rounded once."""
    from fractions import Fraction
    x = Fraction(s)
    d = F32(float(x))
    cands = [d, np.nextafter(d, F32(np.inf)), np.nextafter(d, F32(-np.inf))]
    return min(cands, key=lambda c: (abs(Fraction(float(c)) - x),
                                     int(np.array(c, dtype=F32).view(np.uint32)) & 1))


NF4_THRESHOLDS = np.array([f32_from_decimal(s) for s in NF4_THRESHOLD_LITERALS], dtype=F32)


def _linspace_f32_fused(start, end, steps):
    """torch.linspace(start, end, steps, dtype=float32) as the CPU kernel computes it."""
    s, e = F32(start), F32(end)
    step = F32((e - s) / F32(steps - 1))
    half = steps // 2
    out = np.empty(steps, dtype=F32)
    for i in range(steps):
        if i < half:
            out[i] = F32(float(s) + float(step) * i)        # exact in float64, one rounding
        else:
            out[i] = F32(float(e) - float(step) * (steps - i - 1))
    return out


def dynamic_map():
    """create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): (256,) float32."""
    data = []
    for i in range(7):
        b = _linspace_f32_fused(0.1, 1.0, 2 ** i + 1)
        means = (b[:-1] + b[1:]) / F32(2.0)
        v = F32(10.0 ** (i - 6)) * means          # torch casts the Python scalar to fp32
        data += [float(x) for x in v]
        data += [float(-x) for x in v]
    data += [0.0, 1.0]
    assert len(data) == 256
    return np.array(sorted(data), dtype=F32)


def _blocks(x, bs):
    """Pads a 1-D float32 array to whole blocks; returns (n_blocks, bs) view and n."""
    n = x.size
    nb = -(-n // bs)
    pad = np.zeros(nb * bs, dtype=F32)
    pad[:n] = x
    return pad.reshape(nb, bs), n


def block_absmax(x, bs):
    """max |x| per block of bs (the last one partial; the pad zeros do not change a max)."""
    blk, _ = _blocks(np.abs(x).astype(F32), bs)
    return blk.max(axis=1).astype(F32)


def nf4_codes(v):
    """dQuantizeNF4 on an fp32 array: count of thresholds strictly below v; NaN -> 0."""
    q = np.searchsorted(NF4_THRESHOLDS, v, side="left").astype(np.uint8)
    q[np.isnan(v)] = 0
    return q


def dquantize8(code, x):
    """bnb dQuantize<0> (binary search from pivot 127, fp32 midpoints), vectorized."""
    x = np.asarray(x, dtype=F32)
    n = x.size
    pivot = np.full(n, 127, np.int64)
    upper_p = np.full(n, 255, np.int64)
    lower_p = np.zeros(n, np.int64)
    lower = np.full(n, -1.0, F32)
    upper = np.full(n, 1.0, F32)
    val = code[pivot]
    i = 64
    while i > 0:
        gt = x > val
        lower_p = np.where(gt, pivot, lower_p)
        lower = np.where(gt, val, lower)
        upper_p = np.where(gt, upper_p, pivot)
        upper = np.where(gt, upper, val)
        pivot = np.where(gt, pivot + i, pivot - i)
        val = code[pivot]
        i >>= 1
    upper = np.where(upper_p == 255, code[255], upper).astype(F32)
    lower = np.where(lower_p == 0, code[0], lower).astype(F32)
    gt = x > val
    mid_up = ((upper + val) * F32(0.5)).astype(F32)
    mid_lo = ((lower + val) * F32(0.5)).astype(F32)
    out = np.where(gt, np.where(x > mid_up, upper_p, pivot), np.where(x < mid_lo, lower_p, pivot))
    return out.astype(np.uint8)


def quantize_nf4(w, blocksize=64, nested_blocksize=256, code8=None):
    """quantize_4bit(w, blocksize, compress_statistics=True, quant_type='nf4') in numpy.

    w: float32 array (any shape; flattened row-major). Returns a dict with 'codes' (uint8,
    (n+1)//2), 'qabsmax' (uint8, n_blocks), 'nested_absmax' (float32), 'offset' (float32),
    'absmax' (float32, the exact per-block absmax before double quantization)."""
    x = np.ascontiguousarray(w, dtype=F32).reshape(-1)
    n = x.size
    am = block_absmax(x, blocksize)
    blk, _ = _blocks(x, blocksize)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = (F32(1.0) / am).astype(F32)
        v = (blk * inv[:, None]).astype(F32).reshape(-1)[:n]
    q = nf4_codes(v)
    if n % 2:
        q = np.concatenate([q, np.zeros(1, np.uint8)])
    codes = ((q[0::2] << 4) | q[1::2]).astype(np.uint8)
    out = {"codes": codes, "absmax": am, "n": n, "blocksize": blocksize}
    if not nested_blocksize:
        return out
    code8 = dynamic_map() if code8 is None else code8
    offset = F32(math.fsum(am.astype(np.float64).tolist()) / am.size)
    centered = (am - offset).astype(F32)
    nam = block_absmax(centered, nested_blocksize)
    cb, nb = _blocks(centered, nested_blocksize)
    with np.errstate(divide="ignore", invalid="ignore"):
        ninv = (F32(1.0) / nam).astype(F32)
        cv = (cb * ninv[:, None]).astype(F32).reshape(-1)[:nb]
    out.update({"qabsmax": dquantize8(code8, cv), "nested_absmax": nam, "offset": offset,
                "nested_map": code8, "nested_blocksize": nested_blocksize})
    return out


def absmax_from_nested(qabsmax, nested_absmax, code8, offset, nested_blocksize=256):
    """dequantize_blockwise(qabsmax) + offset, in fp32 (two roundings)."""
    idx = np.arange(qabsmax.size) // nested_blocksize
    a = (code8[qabsmax] * nested_absmax[idx]).astype(F32)
    return (a + F32(offset)).astype(F32)


def dequantize_nf4(codes, absmax, n, blocksize=64):
    """W = NF4[q] * absmax[block], fp32, flattened (n,)."""
    q = np.empty(codes.size * 2, np.uint8)
    q[0::2] = codes >> 4
    q[1::2] = codes & 15
    q = q[:n]
    return (NF4_CODE[q] * absmax[np.arange(n) // blocksize]).astype(F32)


# ---------------------------------------------------------------------------------------
# bnb 4-bit safetensors layout (formats.md 5.5)

def bnb_tensors(prefix, shape, qs, dtype_name="bfloat16"):
    """{name: (safetensors dtype, shape, bytes)} for one Linear4bit weight saved by
    transformers + bitsandbytes: P.weight U8 [(n+1)//2, 1] + the packed quant state."""
    meta = {"quant_type": "nf4", "blocksize": qs["blocksize"], "dtype": dtype_name,
            "shape": list(shape), "nested_blocksize": qs["nested_blocksize"],
            "nested_dtype": "float32", "nested_offset": float(qs["offset"])}
    blob = json.dumps(meta).encode("utf-8")
    return {
        prefix + "weight": ("U8", [qs["codes"].size, 1], qs["codes"].tobytes()),
        prefix + "weight.absmax": ("U8", [qs["qabsmax"].size], qs["qabsmax"].tobytes()),
        prefix + "weight.quant_map": ("F32", [16], NF4_CODE.tobytes()),
        prefix + "weight.nested_absmax": ("F32", [qs["nested_absmax"].size],
                                          qs["nested_absmax"].astype(F32).tobytes()),
        prefix + "weight.nested_quant_map": ("F32", [256], qs["nested_map"].astype(F32).tobytes()),
        prefix + "weight.quant_state.bitsandbytes__nf4": ("U8", [len(blob)], blob),
    }


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: (dtype, shape, bytes)} -> a .safetensors file (formats.md 1.1)."""
    header, off, chunks = {}, 0, []
    if metadata:
        header["__metadata__"] = metadata
    for name, (dt, shape, data) in tensors.items():
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
        chunks.append(data)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)


# ---------------------------------------------------------------------------------------
# ftune pack reader (layout documented in offload/pack.h)

PACK_MAGIC = b"FTPACK\x00\x01"
PACK_DT_BF16, PACK_DT_F32, PACK_DT_NF4 = 1, 2, 3
PACK_ROLE_ATTN_NORM, PACK_ROLE_FFN_NORM = 1, 2
PACK_ROLE_W0, PACK_ROLE_B0 = 16, 32
PACK_ROLE_EMBED, PACK_ROLE_FINAL_NORM, PACK_ROLE_LM_HEAD = 48, 49, 50
PROJ_ORDER = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

_HDR = struct.Struct("<8sIIIIIIIIqqQQQqqII")
_BLK = struct.Struct("<QQQII")
_TEN = struct.Struct("<IIqqqqqqqqIIfI")


def read_pack(path):
    """Parses an ftune pack: returns (header dict, blocks list); each block is a dict with
    'layer' (-1 for the embeddings/head block) and 'tensors': {role: dict of arrays}."""
    with open(path, "rb") as f:
        raw = f.read()
    h = dict(zip(["magic", "version", "header_bytes", "quant", "blocksize", "nested_blocksize",
                  "n_layers", "n_blocks", "config_bytes", "config_off", "block_table_off",
                  "identity", "settings", "file_bytes", "reserved0", "reserved1", "complete",
                  "header_sum"], _HDR.unpack_from(raw, 0)))
    assert h["magic"] == PACK_MAGIC, h["magic"]
    h["config"] = json.loads(raw[h["config_off"]:h["config_off"] + h["config_bytes"]] or b"{}")
    blocks = []
    for i in range(h["n_blocks"]):
        off, nbytes, csum, layer, nt = _BLK.unpack_from(raw, h["block_table_off"] + i * _BLK.size)
        blk = raw[off:off + nbytes]
        ts = {}
        for k in range(nt):
            (role, dt, rows, cols, data_off, data_bytes, absmax_off, nested_off, map_off,
             code_off, bs, nbs, offset, _pad) = _TEN.unpack_from(blk, k * _TEN.size)
            t = {"dtype": dt, "rows": rows, "cols": cols}
            d = np.frombuffer(blk, np.uint8, data_bytes, data_off)
            if dt == PACK_DT_BF16:
                t["data"] = (d.view("<u2").astype(np.uint32) << 16).view(F32).reshape(rows, cols)
            elif dt == PACK_DT_F32:
                t["data"] = d.view("<f4").reshape(rows, cols)
            else:
                n = rows * cols
                nb = -(-n // bs)
                t["codes"] = d.copy()
                t["blocksize"], t["nested_blocksize"], t["n"] = bs, nbs, n
                if nbs:
                    nn = -(-nb // nbs)
                    t["qabsmax"] = np.frombuffer(blk, np.uint8, nb, absmax_off).copy()
                    t["nested_absmax"] = np.frombuffer(blk, "<f4", nn, nested_off).copy()
                    t["nested_map"] = np.frombuffer(blk, "<f4", 256, map_off).copy()
                    t["offset"] = F32(offset)
                else:
                    t["absmax"] = np.frombuffer(blk, "<f4", nb, absmax_off).copy()
                t["code"] = np.frombuffer(blk, "<f4", 16, code_off).copy()
            ts[role] = t
        blocks.append({"layer": layer if layer != 0xFFFFFFFF else -1, "offset": off,
                       "bytes": nbytes, "checksum": csum, "tensors": ts})
    return h, blocks
