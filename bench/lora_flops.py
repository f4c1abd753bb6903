"""FLOPs per trained token of ftune's LoRA step on a GGUF model's shape, counted explicitly
(a multiply-add is 2 FLOPs). Used by bench/cpu_train.sh; prints one number.

  linear layers  3 x 2N   forward, recompute in backward, input gradient (no weight
                          gradient: W is frozen)
  LM head        2 x 2VC  forward, input gradient (tied embedding: no weight gradient)
  LoRA           4 x 2r(in+out) per module: forward, recompute, dx, dA and dB
  attention      4 ctx H D per layer for QK^T and PV, ctx = mean causal context;
                 forward + recompute + backward (2x forward) = 4x

usage: lora_flops.py MODEL.gguf [RANK] [MEAN_EXAMPLE_TOKENS]
"""
import sys

from gguf import GGUFReader


def main():
    r = GGUFReader(sys.argv[1])
    rank = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    mean_len = float(sys.argv[3]) if len(sys.argv) > 3 else 128.0

    def kv(k):
        f = r.fields[k]
        return int(f.parts[f.data[0]][0])

    L, C, F = kv("llama.block_count"), kv("llama.embedding_length"), kv("llama.feed_forward_length")
    H, Hkv = kv("llama.attention.head_count"), kv("llama.attention.head_count_kv")
    V = len(r.fields["tokenizer.ggml.tokens"].data)
    D = C // H
    lin = L * (C * H * D + 2 * C * Hkv * D + H * D * C + 3 * C * F)
    lora = L * rank * ((C + H * D) + 2 * (C + Hkv * D) + (H * D + C) + 2 * (C + F) + (F + C))
    attn = L * 4 * (mean_len / 2) * H * D
    print("%.0f" % (3 * 2 * lin + 2 * 2 * V * C + 4 * 2 * lora + 4 * attn))


if __name__ == "__main__":
    main()
