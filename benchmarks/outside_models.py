"""Outside models through every command, as a user runs them: a sweep, not a unit test.

For each of ~20 outside models (torchvision, Hugging Face transformers built from tiny configs,
timm, and models made in ``build()``), the model file is written into a temporary folder and
every CLI command is run as a subprocess of the leg's installed ``gradscope`` console script,
from an unrelated working directory (so nothing resolves through the checkout):

    render F -o x.svg        render F --loss --backward -o bw.svg    render F -o x.html
    tree F                   tree F --loss --backward                report F --steps 3 --json r
    memory F --json m.json   memory F --step                         doctor F

Each run records its exit code, wall time and first stderr line. A healthy model must exit 0,
print no traceback, say no NaN/Inf (a value "masked later" is noted, not a problem), and every
file it was asked to write must exist and be non-empty. No weights are downloaded: every model
is built with random weights from its constructor or config.

    python benchmarks/outside_models.py [--leg .venv] [--leg .venv-2.14] [--only gpt2 resnet18]
                                       [--jobs 2] [--out /work/notes/sweep.md] [--json sweep.json]

A model whose imports a leg lacks (torchvision, timm on the 2.13 leg) is skipped there. The
default legs: the Hugging Face and ``build()`` models on ``.venv`` (torch 2.13), the
torchvision and timm models on ``.venv-2.14`` (torch 2.14.1); ``--all-legs`` runs every model
on every leg that can import it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 420

CE = "torch.nn.functional.cross_entropy(output, torch.tensor([3]))"


def tv(call: str, size: int = 64, batch: int = 1) -> str:
    # batch 2 where the last feature map is 1 x 1: BatchNorm in train mode needs more than one
    # value per channel (torch refuses batch 1 there; gradscope says so, exit 2)
    return f"""
        import torch
        import torchvision

        torch.manual_seed(0)
        model = torchvision.models.{call}
        example_input = torch.randn({batch}, 3, {size}, {size})


        def loss_fn(output):
            return {CE if batch == 1 else CE.replace("[3]", "[3, 1]")}
        """


def timm(name: str, kwargs: str = "", size: int = 64) -> str:
    return f"""
        import timm
        import torch

        torch.manual_seed(0)
        model = timm.create_model("{name}", pretrained=False, num_classes=10{kwargs})
        example_input = torch.randn(1, 3, {size}, {size})


        def loss_fn(output):
            return {CE}
        """


def hf(imports: str, config: str, make: str, inputs: str) -> str:
    return f"""
        import torch
        from transformers import {imports}

        config = {config}


        def build():
            torch.manual_seed(0)
            model = {make}(config)
            return model, {inputs}


        def loss_fn(output):
            return output.loss
        """


IDS = "torch.randint(1, 100, (2, 12))"

MODELS: dict[str, tuple[str, str]] = {
    # name: (leg requirement, source)
    "tv_resnet18": ("torchvision", tv("resnet18(weights=None)")),
    "tv_resnet50": ("torchvision", tv("resnet50(weights=None)")),
    "tv_mobilenet_v3": ("torchvision", tv("mobilenet_v3_small(weights=None)")),
    "tv_vit_b_16": ("torchvision", tv("vit_b_16(weights=None, image_size=32)", 32)),
    "tv_convnext_tiny": ("torchvision", tv("convnext_tiny(weights=None)", 32)),
    "tv_efficientnet_b0": ("torchvision", tv("efficientnet_b0(weights=None)", 32, 2)),
    "tv_densenet121": ("torchvision", tv("densenet121(weights=None)", 32, 2)),
    "timm_convnext_atto": ("timm", timm("convnext_atto")),
    "timm_vit_tiny": ("timm", timm("vit_tiny_patch16_224", ", img_size=32, patch_size=8", 32)),
    "timm_resnet18d": ("timm", timm("resnet18d")),
    "hf_gpt2": ("transformers", hf(
        "GPT2Config, GPT2LMHeadModel",
        "GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=100)",
        "GPT2LMHeadModel", f'{{"input_ids": (i := {IDS}), "labels": i}}')),
    "hf_bert": ("transformers", hf(
        "BertConfig, BertForSequenceClassification",
        "BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,"
        " intermediate_size=64, max_position_embeddings=32, pad_token_id=0)",
        "BertForSequenceClassification",
        '{"input_ids": torch.tensor([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 0]]),'
        ' "attention_mask": torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]]),'
        ' "labels": torch.tensor([0, 1])}')),
    "hf_distilbert": ("transformers", hf(
        "DistilBertConfig, DistilBertForSequenceClassification",
        "DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=2, hidden_dim=64,"
        " max_position_embeddings=32, pad_token_id=0)",
        "DistilBertForSequenceClassification",
        f'{{"input_ids": {IDS}, "labels": torch.tensor([0, 1])}}')),
    "hf_t5": ("transformers", hf(
        "T5Config, T5ForConditionalGeneration",
        "T5Config(vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=2,"
        " num_decoder_layers=2, num_heads=2, decoder_start_token_id=0, pad_token_id=0,"
        " use_cache=False)",
        "T5ForConditionalGeneration",
        f'{{"input_ids": {IDS}, "labels": torch.randint(1, 100, (2, 6))}}')),
    "hf_llama": ("transformers", hf(
        "LlamaConfig, LlamaForCausalLM",
        "LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,"
        " num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,"
        " use_cache=False)",
        "LlamaForCausalLM", f'{{"input_ids": (i := {IDS}), "labels": i}}')),
    "hf_whisper": ("transformers", hf(
        "WhisperConfig, WhisperForConditionalGeneration",
        "WhisperConfig(vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1,"
        " encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,"
        " decoder_ffn_dim=64, num_mel_bins=8, max_source_positions=16,"
        " max_target_positions=16, pad_token_id=0, decoder_start_token_id=1, use_cache=False)",
        "WhisperForConditionalGeneration",
        '{"input_features": torch.randn(1, 8, 32), "labels": torch.randint(2, 100, (1, 6))}')),
    "hf_vit": ("transformers", hf(
        "ViTConfig, ViTForImageClassification",
        "ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=32,"
        " num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, num_labels=10)",
        "ViTForImageClassification",
        '{"pixel_values": torch.randn(1, 3, 32, 32), "labels": torch.tensor([3])}')),
    "built_mlp_empty": ("", """
        import torch


        class MLP(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.w1 = torch.nn.Parameter(torch.empty(16, 32))
                self.w2 = torch.nn.Parameter(torch.empty(32, 4))
                torch.nn.init.kaiming_uniform_(self.w1)
                torch.nn.init.kaiming_uniform_(self.w2)

            def forward(self, x):
                return torch.relu(x @ self.w1) @ self.w2


        def build():
            torch.manual_seed(0)
            return MLP(), torch.randn(8, 16)


        def loss_fn(output):
            return output.pow(2).mean()
        """),
    "built_cnn_bn": ("", """
        import torch
        from torch import nn


        def build():
            torch.manual_seed(0)
            net = nn.Sequential(
                nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5))
            return net, torch.randn(4, 3, 16, 16)


        def loss_fn(output):
            return torch.nn.functional.cross_entropy(output, torch.tensor([0, 1, 2, 3]))
        """),
    "built_lstm_emb": ("", """
        import torch
        from torch import nn


        class Tagger(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(50, 16, padding_idx=0)
                self.rnn = nn.LSTM(16, 24, batch_first=True, bidirectional=True)
                self.head = nn.Linear(48, 6)

            def forward(self, ids):
                out, _ = self.rnn(self.emb(ids))
                return {"logits": self.head(out), "hidden": out}


        def build():
            torch.manual_seed(0)
            return Tagger(), torch.tensor([[3, 4, 5, 0, 0], [6, 7, 8, 9, 0]])


        def loss_fn(output):
            return output["logits"].logsumexp(-1).mean()
        """),
    "built_transformer": ("", """
        import torch
        from torch import nn


        def build():
            torch.manual_seed(0)
            layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
            model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            x = torch.randn(2, 10, 32)
            mask = torch.zeros(2, 10, dtype=torch.bool)
            mask[0, 7:] = True
            return model, {"src": x, "src_key_padding_mask": mask}


        def loss_fn(output):
            return output.pow(2).mean()
        """),
}

#: name -> (arguments after FILE, files it must write (relative to the run folder))
COMMANDS: dict[str, tuple[list[str], list[str]]] = {
    "render": (["-o", "x.svg"], ["x.svg"]),
    "render --loss --backward": (["--loss", "--backward", "-o", "bw.svg"], ["bw.svg"]),
    "render html": (["-o", "x.html"], ["x.html"]),
    "tree": ([], []),
    "tree --loss --backward": (["--loss", "--backward"], []),
    "report": (["--steps", "3", "--json", "r.json"], ["r.json"]),
    "memory": (["--json", "m.json"], ["m.json"]),
    "memory --step": (["--step"], []),
    "doctor": ([], []),
}

NONFINITE = re.compile(r"\b(nan|inf|non-finite)\b", re.IGNORECASE)
TABLE = re.compile("[┃│┏┗┡━]")


@dataclass
class Run:
    leg: str
    model: str
    command: str
    rc: int
    seconds: float
    first_stderr: str
    problem: str  # "" when healthy
    note: str  # something said that is not a problem (a masked value)


def leg_has(python: Path, module: str) -> bool:
    if not module:
        return True
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([str(python), "-c", code], capture_output=True).returncode == 0


def judge(rc: int, out: str, err: str, missing: list[str]) -> tuple[str, str]:
    text = out + "\n" + err
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if "Traceback" in text:
        return "traceback: " + next(ln for ln in lines if "Traceback" in ln), ""
    if rc != 0:
        first = next((ln for ln in err.splitlines() if ln.strip()), "")
        return f"exit {rc}: " + (first or (lines[-1] if lines else "")), ""
    if missing:
        return "missing or empty: " + ", ".join(missing), ""
    # a table's rows and header (report's "nan" and "inf" columns) are no finding: a non-finite
    # gradient there sets the exit code, which is judged above
    bad = [ln for ln in lines if NONFINITE.search(ln) and not TABLE.search(ln)]
    masked = [ln for ln in bad if "masked later" in ln]
    real = [ln for ln in bad if ln not in masked and "0 nan" not in ln.lower()]
    if real:
        return "nan/inf said: " + real[0], ""
    return "", (masked[0] if masked else "")


def run_one(leg: str, exe: Path, model: str, src: Path, command: str, work: Path) -> Run:
    args, files = COMMANDS[command]
    sub = command.split()[0]
    folder = work / f"{model}--{command.replace(' ', '_').replace('-', '')}"
    folder.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(COLUMNS="120", PYTHONSAFEPATH="1", NO_COLOR="1")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([str(exe), sub, str(src), *args], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out = -1, str(exc.stdout or "")
        err = f"timed out after {TIMEOUT} s"
    seconds = time.perf_counter() - t0
    missing = [f for f in files if not (folder / f).is_file() or (folder / f).stat().st_size == 0]
    if sub != "render" and not out.strip():
        missing.append("stdout")
    problem, note = judge(rc, out, err, missing)
    # the first line that is not a library's own warning (transformers' config notes)
    said = [ln.strip() for ln in err.splitlines() if ln.strip()]
    first = next((ln for ln in said if not ln.startswith("[transformers]")), "")
    (folder / "stdout.txt").write_text(out)
    (folder / "stderr.txt").write_text(err)
    return Run(leg, model, command, rc, round(seconds, 1), first[:200], problem[:300], note[:200])


def write_models(folder: Path, names: list[str]) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in names:
        path = folder / f"{name}.py"
        path.write_text(textwrap.dedent(MODELS[name][1]).lstrip())
        paths[name] = path
    return paths


def table(runs: list[Run]) -> str:
    cmds = list(COMMANDS)
    head = "| leg | model | " + " | ".join(f"`{c}`" for c in cmds) + " |"
    rows = [head, "|" + " --- |" * (len(cmds) + 2)]
    by = {(r.leg, r.model, r.command): r for r in runs}
    for leg, model in dict.fromkeys((r.leg, r.model) for r in runs):
        cells = []
        for c in cmds:
            r = by.get((leg, model, c))
            if r is None:
                cells.append("")
                continue
            mark = "**FAIL** " if r.problem else ""
            cells.append(f"{mark}{r.rc} · {r.seconds:.0f}s")
        rows.append(f"| {leg} | {model} | " + " | ".join(cells) + " |")
    problems = [r for r in runs if r.problem]
    notes = [r for r in runs if r.note]
    out = ["\n".join(rows), "", f"{len(runs)} runs, {len(problems)} with a problem."]
    if problems:
        out += ["", "Problems (leg, model, command: first problem line):", ""]
        out += [f"- {r.leg} {r.model} `{r.command}`: {r.problem}" for r in problems]
    if notes:
        out += ["", "Said, not a problem:", ""]
        out += [f"- {r.leg} {r.model} `{r.command}`: {r.note}" for r in notes]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--leg", action="append", help="a venv folder (repeatable)")
    ap.add_argument("--all-legs", action="store_true")
    ap.add_argument("--only", nargs="*", help="model names")
    ap.add_argument("--commands", nargs="*", help="command names (default: all)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, help="write the markdown table here")
    ap.add_argument("--json", type=Path, help="write every run as JSON here")
    ap.add_argument("--keep", type=Path, help="run folder (default: a temporary one)")
    ap.add_argument("--merge", type=Path, action="append", default=[],
                    help="an earlier run's --json: its runs join the table (this run's win)")
    a = ap.parse_args()
    legs = a.leg or [".venv", ".venv-2.14"]
    names = a.only or list(MODELS)
    commands = a.commands or list(COMMANDS)
    work = a.keep or Path(tempfile.mkdtemp(prefix="gs-outside-"))
    srcs = write_models(work / "models", names)
    plan = []
    for leg in legs:
        python = (ROOT / leg / "bin" / "python")
        exe = ROOT / leg / "bin" / "gradscope"
        tag = leg.strip("./") or leg
        for name in names:
            need = MODELS[name][0]
            if not leg_has(python, need):
                continue
            if not a.all_legs and len(legs) > 1:
                wants_214 = need in ("torchvision", "timm")
                if wants_214 != (leg.endswith("2.14")):
                    continue
            plan += [(tag, exe, name, srcs[name], c) for c in commands]
    print(f"{len(plan)} runs in {work}", file=sys.stderr)
    runs: list[Run] = []
    with ThreadPoolExecutor(a.jobs) as pool:
        futures = [pool.submit(run_one, leg, exe, n, s, c, work / leg)
                   for leg, exe, n, s, c in plan]
        for f in futures:
            r = f.result()
            runs.append(r)
            flag = r.problem or "ok"
            print(f"{r.leg} {r.model:20} {r.command:26} {r.rc:3} {r.seconds:6.1f}s  {flag}",
                  file=sys.stderr, flush=True)
    seen = {(r.leg, r.model, r.command) for r in runs}
    for earlier in a.merge:
        old = [Run(**d) for d in json.loads(earlier.read_text())]
        runs = [r for r in old if (r.leg, r.model, r.command) not in seen] + runs
    text = table(runs)
    if a.json:
        a.json.write_text(json.dumps([asdict(r) for r in runs], indent=1))
    if a.out:
        a.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
