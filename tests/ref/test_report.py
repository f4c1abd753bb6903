"""The HTML run report (src/train/report.c, `ftune report`, OUT/report.html at the end of a run),
as a person opens it: in headless Chromium (Debian's chromium; skipped, naming it, where it is
not installed).

- a short run writes OUT/report.html; each of its four charts has its curve: an SVG polyline
  whose points are one per metrics.jsonl value of that series (train loss raw and smoothed,
  eval loss, lr, tokens/s), in the DOM as Chromium parsed the page; the smoothed curve is
  TensorBoard's smoothing of the losses (checked through the drawn y coordinates); a
  screenshot is taken and shows each curve's color;
- the page loads nothing: no http(s) reference but the SVG namespace;
- `ftune report A B --out F`: one curve per run on every chart and a table of both runs;
- `ftune report` on a folder that is no run, and without a folder: one error line, exit 1 / 2.
"""
import json
import math
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from cli_helpers import SEED_DATA, TINY, ftune_bin

ARGS = ["--seq-len", "64", "--threads", "2", "--seed", "3", "--eval-fraction", "0.2",
        "--eval-max", "8", "--warmup-steps", "2", "--lr", "0.01"]
TIMEOUT = 300
CHARTS = {"train_loss": ("train_loss", "train_loss_smoothed"), "eval_loss": ("eval_loss",),
          "lr": ("lr",), "tokens_per_s": ("tokens_per_s",)}
# the single-run colors of report.c: smoothed train loss, eval loss, lr, tokens/s
COLORS = {"train_loss": (0x1f, 0x77, 0xb4), "eval_loss": (0xff, 0x7f, 0x0e),
          "lr": (0x2c, 0xa0, 0x2c), "tokens_per_s": (0x94, 0x67, 0xbd)}
SMOOTHING = 0.6


def chromium():
    for name in ("chromium", "chromium-browser"):
        p = shutil.which(name)
        if p:
            return p
    pytest.skip("headless Chromium not installed (Debian package chromium; scripts/deps.sh "
                "installs it when it can)")


def browse(html, tmp_path, *what):
    """Runs headless Chromium on the file html with the given mode flags; returns stdout."""
    prof = tmp_path / "chromium-profile"
    r = subprocess.run([chromium(), "--headless=new", "--no-sandbox", "--disable-gpu",
                        "--hide-scrollbars", "--no-first-run", f"--user-data-dir={prof}",
                        "--window-size=1200,1400", *what, Path(html).resolve().as_uri()],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


class Curves(HTMLParser):
    """The polylines of each <figure id="chart-X">: {X: [attrs, ...]}."""

    def __init__(self):
        super().__init__()
        self.charts, self.cur = {}, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "figure" and a.get("id", "").startswith("chart-"):
            self.cur = a["id"][6:]
            self.charts[self.cur] = []
        elif tag == "polyline" and self.cur:
            self.charts[self.cur].append(a)

    def handle_endtag(self, tag):
        if tag == "figure":
            self.cur = None


def curves(html_text):
    p = Curves()
    p.feed(html_text)
    return p.charts


def train(out, *extra):
    r = subprocess.run([ftune_bin(), "train", "--model", str(TINY), "--data", str(SEED_DATA),
                        "--out", str(out)] + ARGS + [str(a) for a in extra],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    return r


def series(out):
    rows = [json.loads(l) for l in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    fin = lambda v: v is not None and math.isfinite(v)
    return {"train_loss": [r["loss"] for r in steps if fin(r["loss"])],
            "train_loss_smoothed": [r["loss"] for r in steps if fin(r["loss"])],
            "eval_loss": [r["eval_loss"] for r in rows if "eval_loss" in r and fin(r["eval_loss"])],
            "lr": [r["lr"] for r in steps if fin(r["lr"])],
            "tokens_per_s": [r["tokens_per_s"] for r in steps if fin(r["tokens_per_s"])]}


def tb_smooth(ys, w):
    """TensorBoard's scalar smoothing (vz_line_chart2 line-chart.ts: debiased EMA)."""
    if all(y == ys[0] for y in ys):
        return list(ys)
    last, out = 0.0, []
    for k, y in enumerate(ys, 1):
        last = last * w + (1 - w) * y
        out.append(last / (1 - w ** k))
    return out


def pts(a):
    return [tuple(map(float, p.split(","))) for p in a["points"].split()]


def check_single(html_text, out, run):
    want = series(out)
    charts = curves(html_text)
    assert set(charts) == set(CHARTS), charts.keys()
    for cid, kinds in CHARTS.items():
        got = {a["data-series"]: a for a in charts[cid]}
        assert set(got) == set(kinds), (cid, got.keys())
        for k in kinds:
            a = got[k]
            assert a["data-run"] == run
            n = len(want[k])
            assert n > 1 and int(a["data-points"]) == n == len(pts(a)), (cid, k, n, a["data-points"])
    # the smoothed curve: the y pixels are an affine map of the values, so the smoothed
    # values and the raw ones map with the same scale and offset
    raw = [y for _, y in pts(next(a for a in charts["train_loss"] if a["data-series"] == "train_loss"))]
    sm = [y for _, y in pts(next(a for a in charts["train_loss"] if a["data-series"] == "train_loss_smoothed"))]
    v = want["train_loss"]
    i, j = v.index(min(v)), v.index(max(v))
    scale = (raw[i] - raw[j]) / (v[i] - v[j])
    off = raw[i] - scale * v[i]
    exp = [scale * s + off for s in tb_smooth(v, SMOOTHING)]
    assert max(abs(a - b) for a, b in zip(sm, exp)) < 0.02, list(zip(sm, exp))[:5]


def test_run_report_in_chromium(tmp_path):
    out = tmp_path / "run"
    train(out, "--max-steps", "16", "--eval-every", "4")
    html = out / "report.html"
    assert html.is_file()
    text = html.read_text()
    check_single(text, out, "run")
    # nothing from the network: the only URL is the SVG namespace
    assert text.count("http://") == text.count("http://www.w3.org/2000/svg")
    assert "https://" not in text and "<link" not in text and "src=" not in text
    # the DOM as Chromium parsed and laid out the page has the same curves
    dom = browse(html, tmp_path, "--dump-dom")
    check_single(dom, out, "run")
    assert "<h2>Summary</h2>" in dom and "<h2>Settings</h2>" in dom
    # a screenshot: each chart's curve color is on it
    png = tmp_path / "report.png"
    browse(html, tmp_path, f"--screenshot={png}")
    assert png.stat().st_size > 10000
    Image = pytest.importorskip("PIL.Image")
    im = Image.open(png).convert("RGB")
    assert im.size == (1200, 1400)
    colors = {c: n for n, c in im.getcolors(maxcolors=1 << 24)}
    for cid, rgb in COLORS.items():
        assert colors.get(rgb, 0) >= 30, (cid, rgb, colors.get(rgb, 0))
    print("screenshot pixels per curve color:", {k: colors.get(v, 0) for k, v in COLORS.items()})

    # `ftune report DIR` redraws the same page
    os.remove(html)
    r = subprocess.run([ftune_bin(), "report", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(html)
    assert html.read_text() == text


def test_compare_runs(tmp_path):
    a, b = tmp_path / "lr_a", tmp_path / "lr_b"
    train(a, "--max-steps", "8", "--eval-every", "4")
    train(b, "--max-steps", "6", "--eval-every", "3", "--lr", "0.002")
    cmp = tmp_path / "cmp.html"
    r = subprocess.run([ftune_bin(), "report", str(a), str(b), "--out", str(cmp), "--title", "two runs"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    dom = browse(cmp, tmp_path, "--dump-dom")
    charts = curves(dom)
    for run, out in (("lr_a", a), ("lr_b", b)):
        want = series(out)
        for cid, kinds in CHARTS.items():
            mine = [x for x in charts[cid] if x["data-run"] == run]
            assert sorted(x["data-series"] for x in mine) == sorted(kinds), (cid, run)
            for x in mine:
                assert int(x["data-points"]) == len(want[x["data-series"]]) == len(pts(x))
    assert dom.count('<tr><td><i class="sw"') == 2 and "<title>two runs</title>" in dom


def test_report_errors(tmp_path):
    r = subprocess.run([ftune_bin(), "report", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ftune: ") and "metrics.jsonl" in lines[0], r.stderr
    assert not (tmp_path / "report.html").exists()
    r = subprocess.run([ftune_bin(), "report"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "run folder" in r.stderr
    r = subprocess.run([ftune_bin(), "report", "a", "b"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--out" in r.stderr
