"""DPO (`ftune train --method dpo`) against an independent float64 numpy reference, on
tests/fixtures/tiny-llama with the bundled preference pairs (alpaca_seed_pref.jsonl: TRL's
conversational explicit-prompt form; the fixture has no chat template, so the Alpaca prompt):

1. at step 0 the policy is the reference model, so the eval loss is exactly ln 2
   (metrics.jsonl writes it with 17 digits), the eval rewards and accuracy 0; the first
   training step's loss is ln 2 too; summary.json names the method and the DPO settings.
2. the final eval loss and the eval reward metrics equal those computed here: every eval
   pair tokenized by `ftune tokenize --preference`; logp = the sum of the log-probabilities
   of the completion tokens (labels != -100; the logits at t predict token t+1) from
   llama_ref's forward with the base model (the reference) and with the written adapter
   merged (the policy); the pair losses of TRL's DPOTrainer (trl/trainer/dpo_trainer.py,
   _compute_loss with f_divergence_type "reverse_kl", and its logged metrics) written out
   in trl_dpo() below, not taken from ftune: sigmoid, ipo (log-ratios averaged per
   completion token), robust (label smoothing) and hinge. The gradient's sign, for each
   loss: one small step on two pairs lowers those pairs' eval loss from the tie's.
3. --init-adapter: the reference is the starting model (base + that adapter, TRL's "ref"
   copy): the step-0 eval is ln 2 again, and the final eval matches numpy with that
   reference. LoRA dropout defaults to 0 under DPO: the first step's loss from a non-zero
   adapter is ln 2, and with --lora-dropout 0.3 (the control) it is not.
4. a run resumed from a copy of checkpoint-3 in a fresh --out (the reference recomputed
   before the checkpoint's adapter is loaded) ends with the same adapter bytes, eval losses
   and step losses as the uninterrupted run.
5. bad settings are refused naming the flag (or the file and line of a non-preference
   record).
6. the reference-free losses (orpo, simpo: LLaMA-Factory's pref_loss options, on per-token
   mean log-probabilities) against ref_free() below at step 0 (the base model) and after
   training, and their one-step sign check.
"""
import json
import math
import os
import shutil

import numpy as np
import pytest

import llama_ref as R
from cli_helpers import (ROOT, SEED_DATA, TINY, adapter_bytes, assert_clean_error, metrics,
                         run_ftune, summary)

PREF = ROOT / "examples" / "data" / "alpaca-seed-tasks" / "alpaca_seed_pref.jsonl"
LN2 = math.log(2.0)
SEQ = 256
N_TRAIN, N_EVAL = 24, 8        # pairs
STEPS, EVAL_EVERY = 6, 3
# the device: FTUNE_DEVICE (tests/run_tests.sh sets cpu), else cpu, never "auto": a machine
# with a GPU runs the CPU path unless asked
DEVICE = os.environ.get("FTUNE_DEVICE") or "cpu"
# lr 0.05, no warmup; --batch-size 2 packs up to 2 full-length pairs' tokens per step (about
# 4 of these pairs): after 6 steps the eval loss is ~0.63 and the log-ratios ~1-3 nats, far
# from the step-0 tie, so the comparisons below test a trained policy
COMMON = ["--method", "dpo", "--seq-len", str(SEQ), "--threads", "2", "--seed", "7",
          "--warmup-ratio", "0", "--batch-size", "2", "--lr", "0.05", "--device", DEVICE]
MAIN = COMMON + ["--max-steps", str(STEPS), "--eval-every", str(EVAL_EVERY), "--save-every",
                 str(EVAL_EVERY), "--keep", "0"]

# Tolerances, ftune vs float64 numpy. CPU: ftune's forward and log-softmax are fp32; the tiny
# model's logits are small (|z| < 1 around lse ~ 10.4), so a token log-probability is good
# to ~1e-7 relative (~1e-6 nats) and a pair's logp, a sum of 50..250 of them, to ~1e-5
# nats; log-ratios (policy - reference) likewise. The losses and rewards are beta (0.1..0.5)
# times such differences. Measured on the 2-core CI machine: eval loss within 5e-8
# relative, rewards within the %.6g rounding of metrics.jsonl, logps within 1e-6 relative.
# The bounds leave ~100x: still far below what a wrong mask (one token more or less: ~10
# nats), a missing beta or another normalization would change.
# cuda: bf16 GEMMs (tests/gpu/peft_parity.py allows 5e-3 on the SFT loss, 5e-2 on logits);
# the values below are not measured yet: the lead's first GPU run reports the differences.
TOL = {
    "cpu": {"loss_rel": 1e-5, "logratio": 1e-4, "logp_rel": 2e-5, "step1": 1e-6},
    "cuda": {"loss_rel": 5e-3, "logratio": 5e-2, "logp_rel": 2e-3, "step1": 1e-3},
}[DEVICE.split(":")[0]]
TOL_LOSS_REL = TOL["loss_rel"]   # eval_loss (written with 17 digits: no rounding on top)
TOL_LOGRATIO = TOL["logratio"]   # nats: rewards = beta * logratio, so |reward diff| <= beta * this
TOL_LOGP_REL = TOL["logp_rel"]   # logps/* means (~ -600 nats; %.6g adds up to 5e-6 relative)
G6 = 5e-6                        # relative rounding of metrics.jsonl's %.6g numbers
# step 1 of a run with dropout 0: the policy forward of a training step and the reference
# (eval) forward see the same weights; the loss is ln 2 up to %.6g (1.8e-7 here) and the
# differences between the two code paths (|beta * delta| / 2 < 1e-6: |delta| < 2e-5 nats)
TOL_STEP1 = TOL["step1"]
MOVED = 0.01                     # the final eval loss is this far from the tie's at least


# ---------------------------------------------------------------------------------------
# TRL's DPO, from its definitions (dpo.h names the same sources; nothing here calls ftune)

def logsigmoid(x):
    return -np.logaddexp(0.0, -np.asarray(x, dtype=np.float64))


def trl_dpo(kind, beta, eps, pol, ref):
    """Means over pairs of TRL's DPO loss and its logged eval metrics. pol, ref: (P, 4)
    float64 rows (logp chosen, completion tokens chosen, logp rejected, tokens rejected) of
    the policy and the reference model."""
    lc = pol[:, 0] - ref[:, 0]          # chosen_logratios
    lr = pol[:, 2] - ref[:, 2]          # rejected_logratios
    delta = lc - lr                      # delta_score (reverse KL: the scores are the log-ratios)
    if kind == "sigmoid":
        loss = -logsigmoid(beta * delta)
    elif kind == "hinge":                # SLiC
        loss = np.maximum(0.0, 1.0 - beta * delta)
    elif kind == "ipo":                  # scores averaged over the completion tokens
        d = lc / pol[:, 1] - lr / pol[:, 3]
        loss = (d - 1.0 / (2.0 * beta)) ** 2
    elif kind == "robust":               # Chowdhury et al. 2024, label smoothing eps
        loss = (-(1 - eps) * logsigmoid(beta * delta) + eps * logsigmoid(-beta * delta)) / (1 - 2 * eps)
    else:
        raise ValueError(kind)
    rc, rr = beta * lc, beta * lr         # chosen_rewards, rejected_rewards (no averaging)
    return {
        "eval_loss": float(loss.mean()),
        "eval_rewards/chosen": float(rc.mean()),
        "eval_rewards/rejected": float(rr.mean()),
        "eval_rewards/accuracies": float((rc > rr).mean()),
        "eval_rewards/margins": float((rc - rr).mean()),
        "eval_logps/chosen": float(pol[:, 0].mean()),
        "eval_logps/rejected": float(pol[:, 2].mean()),
        "eval_pairs": len(pol),
        "eval_tokens": int(pol[:, 1].sum() + pol[:, 3].sum()),
        "min_abs_margin": float(np.abs(rc - rr).min()),
    }


def ref_free(kind, beta, gamma, pol):
    """Means over pairs of the reference-free losses of LLaMA-Factory's DPO stage
    (pref_loss orpo / simpo, written from Hong et al. 2024 eq. 4-7 and Meng et al. 2024 eq. 6):
    on the log-probabilities averaged per completion token, a (chosen) and b (rejected)."""
    a, b = pol[:, 0] / pol[:, 1], pol[:, 2] / pol[:, 3]
    if kind == "orpo":   # the chosen NLL + beta * the odds-ratio loss; odds = p / (1 - p)
        log_odds = (a - np.log1p(-np.exp(a))) - (b - np.log1p(-np.exp(b)))
        loss = -a - beta * logsigmoid(log_odds)
    elif kind == "simpo":
        loss = -logsigmoid(beta * (a - b) - gamma)
    else:
        raise ValueError(kind)
    rc, rr = beta * a, beta * b
    return {"eval_loss": float(loss.mean()), "eval_rewards/chosen": float(rc.mean()),
            "eval_rewards/rejected": float(rr.mean()),
            "eval_rewards/accuracies": float((rc > rr).mean()),
            "eval_rewards/margins": float((rc - rr).mean()),
            "min_abs_margin": float(np.abs(rc - rr).min())}


def completion_logp(cfg, w, ex):
    """(sum of log p(ids[t+1] | ids[..t]) over t with labels[t+1] != -100, their count)."""
    ids, lab = ex["ids"][:SEQ], ex["labels"][:SEQ]
    tgt = np.array([t for t in range(len(ids) - 1) if lab[t + 1] != -100], dtype=np.int64)
    assert len(tgt) > 0, "a completion without a trained token"
    assert all(lab[t + 1] == ids[t + 1] for t in tgt)
    z = R.forward(cfg, w, ids)[tgt]
    m = z.max(axis=-1)
    lse = m + np.log(np.exp(z - m[:, None]).sum(axis=-1))
    nxt = np.asarray(ids, dtype=np.int64)[tgt + 1]
    return float((z[np.arange(len(tgt)), nxt] - lse).sum()), len(tgt)


def pair_logps(cfg, w, rows):
    return np.array([[*completion_logp(cfg, w, r["chosen"]), *completion_logp(cfg, w, r["rejected"])]
                     for r in rows], dtype=np.float64)


# ---------------------------------------------------------------------------------------
# running ftune

def tokenize_pref(path):
    r = run_ftune(["tokenize", "--model", TINY, "--preference", "--data", path])
    assert r.returncode == 0, r.stderr
    return [json.loads(l) for l in r.stdout.splitlines()]


def train(out, args, *extra, ok=True):
    r = run_ftune(["train", "--model", TINY, "--out", out] + list(args) + [str(x) for x in extra],
                  timeout=300)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Train and eval files of pairs whose both sides fit in SEQ tokens (so that no
    truncation rule is involved), their data args, and the eval pairs as tokenized."""
    d = tmp_path_factory.mktemp("dpo_data")
    lines = PREF.read_text().splitlines()
    rows = tokenize_pref(PREF)
    assert len(rows) == len(lines), "a preference record was skipped or added"
    fit = [i for i, r in enumerate(rows)
           if len(r["chosen"]["ids"]) <= SEQ and len(r["rejected"]["ids"]) <= SEQ]
    assert len(fit) >= N_TRAIN + N_EVAL
    tr, ev = d / "train.jsonl", d / "eval.jsonl"
    tr.write_text("".join(lines[i] + "\n" for i in fit[:N_TRAIN]))
    ev.write_text("".join(lines[i] + "\n" for i in fit[N_TRAIN:N_TRAIN + N_EVAL]))
    eval_rows = tokenize_pref(ev)
    assert eval_rows == [rows[i] for i in fit[N_TRAIN:N_TRAIN + N_EVAL]]
    return {"args": ["--data", str(tr), "--eval-data", str(ev)], "eval_rows": eval_rows,
            "train": tr}


@pytest.fixture(scope="module")
def numpy_model(data):
    """(cfg, base weights, reference logps of the eval pairs under the base model)."""
    cfg, w = R.load_hf(str(TINY))
    return cfg, w, pair_logps(cfg, w, data["eval_rows"])


@pytest.fixture(scope="module")
def main_run(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("dpo_main") / "out"
    train(out, data["args"] + MAIN)
    return out


def ref_loss(kind, beta, eps):
    """The loss of a pair whose policy equals the reference (all log-ratios 0)."""
    if kind == "ipo":
        return (1.0 / (2.0 * beta)) ** 2
    if kind == "hinge":
        return 1.0
    return trl_dpo(kind, beta, eps, np.zeros((1, 4)) + [0, 1, 0, 1], np.zeros((1, 4)))["eval_loss"]


def check_final_eval(out, kind, beta, eps, pol, ref, label):
    """The last eval line of out's metrics.jsonl and summary.json against trl_dpo()."""
    want = trl_dpo(kind, beta, eps, pol, ref)
    _, evals = metrics(out)
    got = evals[-1]
    s = summary(out)
    rel = abs(got["eval_loss"] - want["eval_loss"]) / want["eval_loss"]
    print(f"{label}: eval loss ftune {got['eval_loss']:.10f} numpy {want['eval_loss']:.10f} "
          f"(rel diff {rel:.2e}); min |margin| {want['min_abs_margin']:.4f}")
    for k in ("eval_rewards/chosen", "eval_rewards/rejected", "eval_rewards/margins",
              "eval_logps/chosen", "eval_logps/rejected", "eval_rewards/accuracies"):
        print(f"  {k}: ftune {got[k]:.6g} numpy {want[k]:.8g} diff {got[k] - want[k]:.2e}")
    # the policy moved: a comparison at the tie would test little
    assert abs(want["eval_loss"] - ref_loss(kind, beta, eps)) > MOVED, want
    assert rel <= TOL_LOSS_REL
    assert got["eval_pairs"] == want["eval_pairs"] == N_EVAL
    assert got["eval_tokens"] == want["eval_tokens"]
    for k in ("eval_rewards/chosen", "eval_rewards/rejected", "eval_rewards/margins"):
        assert abs(got[k] - want[k]) <= beta * TOL_LOGRATIO * (2 if "margins" in k else 1) \
            + G6 * abs(want[k]), k
    for k in ("eval_logps/chosen", "eval_logps/rejected"):
        assert abs(got[k] - want[k]) <= TOL_LOGP_REL * abs(want[k]), k
    # accuracy: exact unless a pair's margin is within the fp32 noise (then it may flip)
    if want["min_abs_margin"] > 2 * beta * TOL_LOGRATIO:
        assert abs(got["eval_rewards/accuracies"] - want["eval_rewards/accuracies"]) <= G6
    assert s["final_eval_loss"] == got["eval_loss"]
    assert abs(s["final_eval_reward_accuracy"] - got["eval_rewards/accuracies"]) <= G6
    return want


# ---------------------------------------------------------------------------------------
# 1, 2: the main run (sigmoid)

def test_step0_is_ln2_and_summary(main_run):
    steps, evals = metrics(main_run)
    s = summary(main_run)
    print("evals:", [(e["step"], e["eval_loss"], e["eval_rewards/accuracies"]) for e in evals])
    print("step 1:", steps[0])
    assert [e["step"] for e in evals] == [0, 3, 6]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    e0 = evals[0]
    assert abs(e0["eval_loss"] - LN2) < 1e-12, e0
    for k in ("eval_rewards/chosen", "eval_rewards/rejected", "eval_rewards/margins",
              "eval_rewards/accuracies"):
        assert e0[k] == 0, (k, e0)
    assert e0["eval_pairs"] == N_EVAL
    # step 1: the adapter is the reference still (B = 0) and nothing is dropped
    assert abs(steps[0]["loss"] - LN2) < TOL_STEP1, steps[0]
    # --batch-size 2: micro-batches of up to 2 full-length pairs' tokens (2 * 2 * SEQ)
    assert 1 <= steps[0]["pairs"] <= N_TRAIN
    for k in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
              "logps/chosen", "logps/rejected"):
        assert k in steps[0], k
    assert abs(steps[0]["rewards/chosen"]) <= 0.1 * TOL_LOGRATIO
    assert abs(steps[0]["rewards/rejected"]) <= 0.1 * TOL_LOGRATIO
    # the run moved away from the tie (the step losses are of a few pairs each: noisy)
    assert evals[-1]["eval_loss"] < LN2 - MOVED
    assert s["method"] == "dpo" and s["dpo_loss"] == "sigmoid" and s["dpo_beta"] == 0.1
    assert "dpo_label_smoothing" not in s
    assert s["n_train_pairs"] == N_TRAIN and s["n_eval_pairs"] == N_EVAL
    assert s["initial_eval_loss"] == e0["eval_loss"] and s["final_eval_loss"] == evals[-1]["eval_loss"]
    assert s["steps"] == STEPS
    assert json.loads((main_run / "adapter_config.json").read_text())["lora_dropout"] == 0


def test_final_eval_matches_numpy_sigmoid(main_run, numpy_model, data):
    cfg, w, ref = numpy_model
    pol = pair_logps(cfg, R.apply_peft_adapter(cfg, w, str(main_run)), data["eval_rows"])
    check_final_eval(main_run, "sigmoid", 0.1, 0.0, pol, ref, "sigmoid beta 0.1")


@pytest.mark.parametrize("kind, beta, eps", [("ipo", 0.5, 0.0), ("robust", 0.2, 0.1),
                                                 ("hinge", 0.3, 0.0)])
def test_other_losses_match_numpy(kind, beta, eps, data, numpy_model, tmp_path):
    out = tmp_path / kind
    extra = ["--dpo-loss", kind, "--dpo-beta", beta, "--max-steps", 3]
    if eps:
        extra += ["--dpo-label-smoothing", eps]
    train(out, data["args"] + COMMON, *extra)
    _, evals = metrics(out)
    s = summary(out)
    assert [e["step"] for e in evals] == [0, 3]
    print(f"{kind}: step-0 eval {evals[0]['eval_loss']!r}, want {ref_loss(kind, beta, eps)!r}")
    assert abs(evals[0]["eval_loss"] - ref_loss(kind, beta, eps)) < 1e-12
    assert s["dpo_loss"] == kind and s["dpo_beta"] == beta
    if kind == "robust":
        assert s["dpo_label_smoothing"] == eps
    cfg, w, ref = numpy_model
    pol = pair_logps(cfg, R.apply_peft_adapter(cfg, w, str(out)), data["eval_rows"])
    check_final_eval(out, kind, beta, eps, pol, ref, f"{kind} beta {beta} eps {eps}")


@pytest.mark.parametrize("kind, eps", [("sigmoid", 0.0), ("ipo", 0.0), ("robust", 0.1),
                                       ("hinge", 0.0), ("orpo", 0.0), ("simpo", 0.0)])
def test_one_step_lowers_the_loss_of_its_pairs(kind, eps, data, tmp_path):
    """The gradient's sign: one step (lr 1e-3) on two pairs, which --batch-size 2 always
    puts in one micro-batch, evaluated on the same two pairs, lowers their loss from the
    tie's (measured: by 0.1..0.4, as Adam's first step moves every B entry by lr)."""
    two = tmp_path / "two.jsonl"
    two.write_text("".join(data["train"].read_text().splitlines(keepends=True)[:2]))
    out = tmp_path / "one"
    extra = ["--dpo-label-smoothing", eps] if eps else []
    train(out, ["--data", two, "--eval-data", two] + COMMON, "--dpo-loss", kind, "--max-steps", 1,
          "--lr", "1e-3", *extra)
    steps, evals = metrics(out)
    print(f"{kind}: step-1 loss {steps[0]['loss']}, eval {evals[0]['eval_loss']} -> "
          f"{evals[-1]['eval_loss']}")
    assert steps[0]["pairs"] == 2 and evals[-1]["eval_pairs"] == 2
    if kind in ("orpo", "simpo"):  # no reference, no tie: the step starts at the base's loss
        # (the step loss is written with %.6g)
        assert abs(steps[0]["loss"] - evals[0]["eval_loss"]) <= (TOL_STEP1 + G6) * evals[0]["eval_loss"]
        # down by far more than the fp noise (1e-10 here); simpo at the default beta 0.1
        # moves little in one step (measured: 0.0025)
        assert evals[-1]["eval_loss"] < evals[0]["eval_loss"] - 1e-4
        return
    tie = ref_loss(kind, 0.1, eps)
    assert abs(steps[0]["loss"] - tie) <= TOL_STEP1 * tie
    assert abs(evals[0]["eval_loss"] - tie) < 1e-12
    assert evals[-1]["eval_loss"] < tie - MOVED


@pytest.mark.parametrize("kind, beta, gamma", [("orpo", 0.2, None), ("simpo", 2.0, 0.8)])
def test_reference_free_losses_match_numpy(kind, beta, gamma, data, numpy_model, tmp_path):
    """orpo and simpo need no reference: the step-0 eval is the base model's loss (numpy with
    the base weights), the final eval the trained adapter's; both against ref_free()."""
    out = tmp_path / kind
    extra = ["--dpo-loss", kind, "--dpo-beta", beta, "--max-steps", 3]
    if gamma is not None:
        extra += ["--simpo-gamma", gamma]
    r = train(out, data["args"] + COMMON, *extra)
    assert "reference-free" in r.stderr
    _, evals = metrics(out)
    s = summary(out)
    assert [e["step"] for e in evals] == [0, 3]
    assert s["dpo_loss"] == kind and s["dpo_beta"] == beta
    if gamma is not None:
        assert s["simpo_gamma"] == gamma
    cfg, w, base = numpy_model
    pol = pair_logps(cfg, R.apply_peft_adapter(cfg, w, str(out)), data["eval_rows"])
    for got, lp, what in ((evals[0], base, "step 0 (base)"), (evals[-1], pol, "final")):
        want = ref_free(kind, beta, gamma, lp)
        rel = abs(got["eval_loss"] - want["eval_loss"]) / abs(want["eval_loss"])
        print(f"{kind} {what}: eval loss ftune {got['eval_loss']:.10f} numpy "
              f"{want['eval_loss']:.10f} (rel diff {rel:.2e})")
        assert rel <= TOL_LOSS_REL
        for k in ("eval_rewards/chosen", "eval_rewards/rejected", "eval_rewards/margins"):
            # rewards are beta * mean logps: the logp tolerance per token, and the %.6g rounding
            assert abs(got[k] - want[k]) <= beta * TOL_LOGRATIO + G6 * abs(want[k]), (k, got[k], want[k])
        if want["min_abs_margin"] > 2 * beta * TOL_LOGRATIO:
            assert abs(got["eval_rewards/accuracies"] - want["eval_rewards/accuracies"]) <= G6
    # the run moved
    assert abs(evals[-1]["eval_loss"] - evals[0]["eval_loss"]) > MOVED


def test_ftune_eval_dpo_matches_training_eval(main_run, data, numpy_model):
    """`ftune eval --method dpo --adapter OUT` on the eval file: the final eval of training
    (the same pairs, the base model as the reference), to fp32 packing noise, and numpy's."""
    ev = data["args"][data["args"].index("--eval-data") + 1]
    r = run_ftune(["eval", "--method", "dpo", "--model", TINY, "--adapter", main_run, "--data", ev,
                   "--seq-len", str(SEQ), "--threads", "2", "--device", DEVICE])
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    _, evals = metrics(main_run)
    cfg, w, ref = numpy_model
    pol = pair_logps(cfg, R.apply_peft_adapter(cfg, w, str(main_run)), data["eval_rows"])
    want = trl_dpo("sigmoid", 0.1, 0.0, pol, ref)
    print(f"ftune eval: loss {got['loss']!r}, training's final eval {evals[-1]['eval_loss']!r}, "
          f"numpy {want['eval_loss']!r}")
    assert got["pairs"] == N_EVAL and got["dpo_loss"] == "sigmoid"
    assert got["tokens"] == evals[-1]["eval_tokens"]
    assert abs(got["loss"] - evals[-1]["eval_loss"]) <= TOL_LOSS_REL * evals[-1]["eval_loss"]
    assert abs(got["loss"] - want["eval_loss"]) <= TOL_LOSS_REL * want["eval_loss"]
    assert abs(got["rewards/accuracies"] - want["eval_rewards/accuracies"]) <= 1e-9
    # the reference-free losses need no reference pass: orpo's loss of the base alone
    r = run_ftune(["eval", "--method", "dpo", "--dpo-loss", "orpo", "--dpo-beta", "0.2", "--model", TINY,
                   "--data", ev, "--seq-len", str(SEQ), "--threads", "2", "--device", DEVICE])
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout)
    w0 = ref_free("orpo", 0.2, None, ref)
    assert abs(o["loss"] - w0["eval_loss"]) <= TOL_LOSS_REL * w0["eval_loss"], (o, w0)


# ---------------------------------------------------------------------------------------
# 3: --init-adapter

def test_init_adapter_is_the_reference(main_run, data, numpy_model, tmp_path):
    cfg, w, _ = numpy_model
    w0 = R.apply_peft_adapter(cfg, w, str(main_run))
    ref0 = pair_logps(cfg, w0, data["eval_rows"])
    out = tmp_path / "init"
    train(out, data["args"] + COMMON, "--init-adapter", main_run, "--max-steps", 3)
    steps, evals = metrics(out)
    print("init-adapter: evals", [(e["step"], e["eval_loss"]) for e in evals],
          "step 1", steps[0]["loss"])
    assert abs(evals[0]["eval_loss"] - LN2) < 1e-12, evals[0]
    assert evals[0]["eval_rewards/margins"] == 0
    # against the base, the same adapter's eval loss was not ln 2: the reference moved
    assert abs(metrics(main_run)[1][-1]["eval_loss"] - LN2) > MOVED
    # dropout 0 by default: the first step's policy is the reference although B != 0
    assert abs(steps[0]["loss"] - LN2) < TOL_STEP1, steps[0]
    pol = pair_logps(cfg, R.apply_peft_adapter(cfg, w, str(out)), data["eval_rows"])
    check_final_eval(out, "sigmoid", 0.1, 0.0, pol, ref0, "init-adapter, reference base + adapter")

    # `ftune eval --ref-adapter` scores that run as its training did: the same final eval loss,
    # and numpy's against the base + adapter reference; without it (the base as the reference)
    # the loss differs
    ev = data["args"][data["args"].index("--eval-data") + 1]
    args = ["eval", "--method", "dpo", "--model", TINY, "--adapter", str(out), "--data", ev,
            "--seq-len", str(SEQ), "--threads", "2", "--device", DEVICE]
    r = run_ftune(args + ["--ref-adapter", str(main_run)])
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    want = trl_dpo("sigmoid", 0.1, 0.0, pol, ref0)
    print(f"ftune eval --ref-adapter: loss {got['loss']!r}, training's final eval "
          f"{evals[-1]['eval_loss']!r}, numpy {want['eval_loss']!r}")
    assert abs(got["loss"] - evals[-1]["eval_loss"]) <= TOL_LOSS_REL * evals[-1]["eval_loss"]
    assert abs(got["loss"] - want["eval_loss"]) <= TOL_LOSS_REL * want["eval_loss"]
    assert abs(got["rewards/accuracies"] - want["eval_rewards/accuracies"]) <= 1e-9
    base_ref = json.loads(run_ftune(args).stdout)["loss"]
    assert abs(base_ref - got["loss"]) > MOVED, (base_ref, got["loss"])
    # a reference-free loss reads no reference; --ref-adapter without --method dpo is refused
    for extra, needle in ((["--dpo-loss", "simpo"], "reference-free"), (None, "--method dpo")):
        a = args + ["--ref-adapter", str(main_run)] + (extra or [])
        if extra is None:
            a = [x for x in a if x not in ("--method", "dpo")]
        r = run_ftune(a)
        assert r.returncode == 2 and needle in r.stderr, (r.returncode, r.stderr)

    # control: with dropout on, the first step's policy differs from the reference
    drop = tmp_path / "drop"
    train(drop, data["args"] + COMMON, "--init-adapter", main_run, "--max-steps", 1,
          "--lora-dropout", 0.3)
    l1 = metrics(drop)[0][0]["loss"]
    print(f"--lora-dropout 0.3: step-1 loss {l1} (ln 2 = {LN2:.6f})")
    assert abs(l1 - LN2) > 100 * TOL_STEP1


# ---------------------------------------------------------------------------------------
# 4: resume

def test_resume_from_checkpoint_copy_is_bit_identical(main_run, data, tmp_path):
    out = tmp_path / "resumed"
    shutil.copytree(main_run / "checkpoint-3", out / "checkpoint-3")
    r = train(out, data["args"] + MAIN, "--resume", out / "checkpoint-3")
    assert f"resuming from {out}/checkpoint-3" in r.stderr, r.stderr
    assert adapter_bytes(out) == adapter_bytes(main_run)
    (ms, me), (rs, re_) = metrics(main_run), metrics(out)
    assert [x["step"] for x in rs] == [4, 5, 6] and [x["step"] for x in re_] == [6]
    keep = lambda rows, ks: [{k: x[k] for k in ks} for x in rows]  # noqa: E731
    sk = ["step", "loss", "grad_norm", "rewards/chosen", "rewards/rejected", "logps/chosen"]
    ek = ["step", "eval_loss", "eval_tokens", "eval_rewards/chosen", "eval_rewards/rejected",
          "eval_rewards/accuracies", "eval_logps/chosen"]
    assert keep(rs, sk) == keep(ms[3:], sk)
    assert keep(re_, ek) == keep(me[-1:], ek)
    s, s0 = summary(out), summary(main_run)
    assert s["resumed_from_step"] == 3
    assert s["final_eval_loss"] == s0["final_eval_loss"]
    assert s["final_eval_reward_accuracy"] == s0["final_eval_reward_accuracy"]


# ---------------------------------------------------------------------------------------
# 5: refusals

@pytest.mark.parametrize("extra, rc, needles", [
    (["--dpo-label-smoothing", "0.1"], 1, ["--dpo-label-smoothing", "robust"]),
    (["--simpo-gamma", "0.3"], 2, ["--simpo-gamma", "simpo"]),
    (["--dpo-loss", "robust", "--dpo-label-smoothing", "0.5"], 1, ["--dpo-label-smoothing"]),
    (["--dpo-beta", "0"], 2, ["--dpo-beta"]),
    (["--dpo-beta", "-0.1"], 2, ["--dpo-beta"]),
    (["--dpo-loss", "kto"], 2, ["--dpo-loss", "kto"]),
    (["--method", "ppo"], 2, ["--method", "ppo"]),
    (["--train-on-prompt"], 1, ["--train-on-prompt"]),
])
def test_bad_settings_are_refused(extra, rc, needles, data, tmp_path):
    out = tmp_path / "bad"
    r = train(out, data["args"] + MAIN + extra, ok=False)
    assert r.returncode == rc, r.stderr
    assert_clean_error(r, out, *needles)


def test_sft_records_are_refused(data, tmp_path):
    """Alpaca SFT records given to --method dpo: the error names the file and the line."""
    out = tmp_path / "sft"
    bad = tmp_path / "sft.jsonl"
    bad.write_text("".join(SEED_DATA.read_text().splitlines(keepends=True)[:5]))
    r = train(out, ["--data", bad] + MAIN, ok=False)
    line = assert_clean_error(r, out, str(bad))
    assert r.returncode == 1
    assert "line 1" in line, line
    # the same records as --eval-data
    r = train(out, data["args"][:2] + ["--eval-data", bad] + MAIN, ok=False)
    line = assert_clean_error(r, out, str(bad), "--eval-data")
    assert "line 1" in line, line
