"""Trainer adapters with the real frameworks on CPU (issue #10): Hugging Face
``Trainer`` (with the callback, and under ``hooktrace run``) and Lightning
``Trainer``. Tiny models built from configs, in-memory data, no downloads."""

from __future__ import annotations

import runpy
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import hooktrace
from test_run import calls_per_module, env

# A script: run in-process (untraced, and with the callback) and under hooktrace run.
HF_SCRIPT = """
    import torch
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    transformers.logging.set_verbosity_error()

    def train(output_dir, callbacks=()):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64,
                                           n_positions=8))
        ids = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(1))
        data = [{"input_ids": row, "labels": row} for row in ids]
        args = TrainingArguments(output_dir=output_dir, max_steps=2, per_device_train_batch_size=2,
                                 logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                                 disable_tqdm=True, seed=0, dataloader_num_workers=0)
        trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=list(callbacks))
        trainer.train()
        return [h["loss"] for h in trainer.state.log_history if "loss" in h]

    if __name__ == "__main__":
        import sys
        print(train(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def hf_script(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    path = tmp_path_factory.mktemp("hf") / "hf_train.py"
    path.write_text(textwrap.dedent(HF_SCRIPT))
    return path, runpy.run_path(str(path), run_name="hf_train")


def test_hf_trainer_callback_two_steps_same_losses(hf_script: tuple[Path, dict[str, Any]],
                                                   tmp_path: Path) -> None:
    from hooktrace.integrations.hf import HooktraceCallback

    _, ns = hf_script
    # GIVEN the untraced losses of two steps
    plain = ns["train"](str(tmp_path / "plain"))
    # WHEN the same training runs with the callback
    callback = HooktraceCallback(tmp_path / "hf.htrace", chrome=tmp_path / "hf.json")
    traced = ns["train"](str(tmp_path / "traced"), [callback])
    # THEN the losses are the same, and the trace holds two steps of the model
    assert len(plain) == 2 and traced == plain
    assert callback.written == [str(tmp_path / "hf.htrace"), str(tmp_path / "hf.json")]
    trace = hooktrace.load(tmp_path / "hf.htrace")
    assert len(trace.steps()) == 2
    calls = calls_per_module(trace)
    assert calls[""] == 2 and calls["transformer.h.0.attn"] == 2, calls
    assert dict(trace.modules)[""] == "GPT2LMHeadModel"
    assert len(trace.spans().nodes) > 0  # backward recorded


def test_hf_trainer_callback_records_numerics_and_shapes(
        hf_script: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """The callback passes trace() options on: numerics and shapes of a real Trainer run."""
    from hooktrace.integrations.hf import HooktraceCallback
    from hooktrace.analysis.numerics import first_nonfinite
    from hooktrace.analysis.shapes import ShapeTable

    _, ns = hf_script
    with pytest.raises(TypeError, match="unknown option 'numeric'"):
        HooktraceCallback(tmp_path / "x.htrace", numeric=True)
    callback = HooktraceCallback(tmp_path / "hf.htrace", numerics=True, shapes=True)
    ns["train"](str(tmp_path / "traced"), [callback])
    trace = hooktrace.load(tmp_path / "hf.htrace")
    rows = {r["module"]: r for r in trace.summary().rows if r["mode"] == "train"}
    mlp = rows["transformer.h.0.mlp"]
    assert mlp["absmax"] > 0 and mlp["rms"] > 0 and mlp["nonfinite"] == 0
    assert mlp["bwd_absmax"] > 0  # the gradient of its input
    assert first_nonfinite(trace) is None
    shapes = {r["module"]: r for r in ShapeTable.from_trace(trace).rows}
    assert shapes["transformer.h.0.mlp"]["in_shapes"].startswith("float32[")
    assert shapes["transformer.h.0.mlp"]["calls"] == 2


def test_hf_trainer_under_hooktrace_run(hf_script: tuple[Path, dict[str, Any]],
                                        tmp_path: Path) -> None:
    path, ns = hf_script
    plain = ns["train"](str(tmp_path / "plain"))
    r = subprocess.run([sys.executable, "-m", "hooktrace", "run", "-o", "run.htrace", str(path),
                        str(tmp_path / "traced")], cwd=tmp_path, env=env(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == repr(plain)  # after the Trainer's own logs
    trace = hooktrace.load(tmp_path / "run.htrace")
    calls = calls_per_module(trace)
    # the model is the one top-level module the Trainer calls (the loss is functional),
    # so no class prefix; steps from its optimizer
    assert trace.info["top_level_modules"] == ["GPT2LMHeadModel"]
    assert calls[""] == 2 and calls["transformer.h.0.mlp"] == 2, calls
    assert len(trace.steps()) == 2


def test_lightning_trainer_callback_max_steps_2(tmp_path: Path) -> None:
    L = pytest.importorskip("lightning")
    import torch
    from torch import nn

    from hooktrace.integrations.lightning import HooktraceCallback

    class Regressor(L.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.mse_loss(self(x), y)
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def fit(callbacks: list[Any]) -> list[float]:
        torch.manual_seed(0)
        module = Regressor()
        module.losses = []
        g = torch.Generator().manual_seed(1)
        data = torch.utils.data.TensorDataset(torch.randn(16, 4, generator=g),
                                              torch.randn(16, 1, generator=g))
        trainer = L.Trainer(max_steps=2, accelerator="cpu", devices=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, callbacks=callbacks)
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
        return module.losses

    plain = fit([])
    callback = HooktraceCallback(tmp_path / "pl.htrace")
    traced = fit([callback])
    assert len(plain) == 2 and traced == plain
    trace = hooktrace.load(tmp_path / "pl.htrace")
    assert len(trace.steps()) == 2
    calls = calls_per_module(trace)
    assert calls[""] == 2 and calls["net.0"] == 2 and calls["net.2"] == 2, calls
    assert dict(trace.modules)[""] == "Regressor"


def test_lightning_callback_with_aggregate_prints_the_aggregate_summary(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN the docs' "On for weeks" setup: aggregate= and summary=True, with validation
    # (issue #38 item 6: the table printed only the last validation's calls)
    L = pytest.importorskip("lightning")
    import torch
    from torch import nn

    from hooktrace.integrations.lightning import HooktraceCallback

    class Regressor(L.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val", nn.functional.mse_loss(self(x), y))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(16, 4, generator=g),
                                          torch.randn(16, 1, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    callback = HooktraceCallback(aggregate=str(tmp_path / "agg"), aggregate_interval=0,
                                 summary=True)
    trainer = L.Trainer(max_steps=6, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[callback],
                        val_check_interval=4, num_sanity_val_steps=0)
    capsys.readouterr()
    trainer.fit(Regressor(), loader, loader)
    # THEN the folder's table: the training steps' rows, not only the last validation's
    err = capsys.readouterr().err
    assert f"{tmp_path / 'agg'}: " in err and " steps aggregated, " in err, err
    rows = {tuple(line.split()[:2]) for line in err.splitlines()}
    assert {("net.0", "forward"), ("net.0", "backward"), ("<step>", "step")} <= rows, err
