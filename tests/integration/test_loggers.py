"""Per-step aggregates into the user's logger (issue #31), read back with TensorBoard's
own reader (event_accumulator): hooktrace.log_to(SummaryWriter), a real Lightning
Trainer (pl_module.log, on_step/on_epoch) and a real HF Trainer (report_to
"tensorboard", through the on_log logs dict)."""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import hooktrace

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def scalars_in(folder: Path) -> dict[str, list[tuple[int, float]]]:
    files = glob.glob(str(folder / "**" / "events.out.tfevents.*"), recursive=True)
    assert files, f"no event file under {folder}"
    out: dict[str, list[tuple[int, float]]] = {}
    for f in files:
        acc = event_accumulator.EventAccumulator(f, size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.body, self.head = nn.Linear(4, 64), nn.Linear(64, 64), nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(torch.relu(self.embed(x)))))


def test_log_to_a_summary_writer_top_n_and_filter(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 4)
    writer = SummaryWriter(str(tmp_path / "tb"))
    with hooktrace.trace(model, aggregate=tmp_path / "agg", aggregate_interval=0) as tr:
        scalars = hooktrace.log_to(writer, tr, top=2, include=["body", "head", "embed"])
        for _ in range(5):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    writer.close()
    got = scalars_in(tmp_path / "tb")
    fwd = sorted(t for t in got if t.startswith("hooktrace/fwd_ms/"))
    # two modules (the filter leaves the root out), the same two at every step
    assert len(fwd) == 2 and scalars.modules is not None and len(scalars.modules) == 2
    assert {t.removeprefix("hooktrace/fwd_ms/") for t in fwd} == set(scalars.modules)
    assert set(scalars.modules) <= {"body", "head", "embed"}
    for tag in fwd + ["hooktrace/step_ms"]:
        assert sorted(s for s, _ in got[tag]) == [0, 1, 2, 3, 4], tag
        assert all(v > 0 for _, v in got[tag])
    assert any(t.startswith("hooktrace/bwd_ms/") for t in got)


def test_log_to_without_a_recording_logs_nothing_and_does_not_raise() -> None:
    # a script that keeps log_to(writer) in, run without hooktrace (issue #38: it raised)
    logged: list[Any] = []
    scalars = hooktrace.log_to(type("W", (), {"add_scalar": lambda *a: logged.append(a)})())
    assert scalars.modules is None and logged == []
    with pytest.raises(TypeError, match="expected a writer with add_scalar"):
        hooktrace.log_to(object())


def test_log_include_of_the_wrong_type_is_one_line(tmp_path: Path) -> None:
    # (issue #35: log_include=5 was "'int' object is not iterable")
    from hooktrace.integrations import TraceSession

    session = TraceSession(None, chrome=None, backward=True, capacity=1 << 16, summary=False,
                           aggregate=str(tmp_path / "agg"))
    with pytest.raises(TypeError, match="^hooktrace: log_include must be fnmatch patterns "
                                        r"\(str, or a list of str\), got int 5$"):
        session.log_scalars(10, 5)
    with pytest.raises(ValueError, match="^hooktrace: log_top must be a number of modules"):
        session.log_scalars(-1, None)
    session.log_scalars(3, ("fc*",))


def test_lightning_trainer_logs_per_module_curves(tmp_path: Path) -> None:
    L = pytest.importorskip("lightning")
    from lightning.pytorch.loggers import TensorBoardLogger

    from hooktrace.integrations.lightning import HooktraceCallback

    class Regressor(L.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = Net()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(24, 4, generator=g),
                                          torch.randn(24, 1, generator=g))
    callback = HooktraceCallback(tmp_path / "pl.htrace", aggregate=tmp_path / "agg", logs=True,
                                 aggregate_interval=0,
                                 log_top=3)
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=1,
                        logger=TensorBoardLogger(str(tmp_path / "tb"), name="run"),
                        log_every_n_steps=1, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[callback])
    trainer.fit(Regressor(), torch.utils.data.DataLoader(data, batch_size=4))  # 6 steps/epoch
    got = scalars_in(tmp_path / "tb")
    step_tags = [t for t in got if t.startswith("hooktrace/fwd_ms/") and t.endswith("_step")]
    epoch_tags = [t for t in got if t.startswith("hooktrace/fwd_ms/") and t.endswith("_epoch")]
    assert len(step_tags) == 3 and len(epoch_tags) == 3, sorted(got)
    for tag in step_tags:
        assert len(got[tag]) == 12, (tag, got[tag])  # on_step: every step of both epochs
    for tag in epoch_tags:
        assert len(got[tag]) == 2  # on_epoch: one mean per epoch
    assert "hooktrace/step_ms_step" in got


def test_hf_trainer_report_to_tensorboard_gets_per_module_curves(tmp_path: Path,
                                                                 monkeypatch: Any) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from hooktrace.integrations.hf import HooktraceCallback

    transformers.logging.set_verbosity_error()
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=64,
                                       n_positions=8))
    ids = torch.randint(0, 64, (8, 8), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4,
                             per_device_train_batch_size=2, logging_steps=2, save_strategy="no",
                             report_to="tensorboard", use_cpu=True, disable_tqdm=True, seed=0,
                             dataloader_num_workers=0)
    callback = HooktraceCallback(tmp_path / "hf.htrace", aggregate=tmp_path / "agg", logs=True,
                                 aggregate_interval=0,
                                 log_top=4, log_include="transformer.h.*")
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train()
    got = scalars_in(tmp_path / "tb")
    # (the Trainer's TensorBoard integration puts training logs under train/)
    fwd = [t for t in got if t.startswith("train/hooktrace/fwd_ms/")]
    assert len(fwd) == 4, sorted(got)
    assert all(t.startswith("train/hooktrace/fwd_ms/transformer.h.") for t in fwd)
    for tag in fwd:
        assert sorted(s for s, _ in got[tag]) == [2, 4], (tag, got[tag])  # at each log
    assert "train/loss" in got or "loss" in got  # the Trainer's own scalars, same file


def _regressor(validate: bool = False) -> Any:
    L = pytest.importorskip("lightning")

    class Regressor(L.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = Net()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.net(x)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    if not validate:
        Regressor.validation_step = None  # type: ignore[assignment]
        del Regressor.validation_step
    return Regressor()


def _loader(n: int) -> Any:
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(n, 4, generator=g),
                                          torch.randn(n, 1, generator=g))
    return torch.utils.data.DataLoader(data, batch_size=4)


def test_lightning_logs_each_window_once_at_its_step_and_a_point_per_epoch(
        tmp_path: Path) -> None:
    L = pytest.importorskip("lightning")
    from lightning.pytorch.loggers import TensorBoardLogger

    from hooktrace.data.aggregates import load_aggregates
    from hooktrace.integrations.lightning import HooktraceCallback

    # GIVEN windows longer than an epoch (issue #47: a window's value was logged again
    # at every later step of the epoch, and an epoch whose windows had not ended had no
    # _epoch point)
    callback = HooktraceCallback(tmp_path / "pl.htrace", aggregate=tmp_path / "agg", logs=True,
                                 aggregate_interval=1e6, log_top=2)
    trainer = L.Trainer(max_epochs=3, accelerator="cpu", devices=1,
                        logger=TensorBoardLogger(str(tmp_path / "tb"), name="run"),
                        log_every_n_steps=1, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[callback])
    trainer.fit(_regressor(), _loader(24))  # 6 steps an epoch
    got = scalars_in(tmp_path / "tb")
    # THEN each epoch's window is logged once, at the epoch's last step, with the
    # window's own value (the aggregates' step row: its time per step)
    table = load_aggregates(tmp_path / "agg")
    steps = [(s, n, t / n) for s, n, t, mode in zip(
        table["step"].to_pylist(), table["steps"].to_pylist(), table["total_ms"].to_pylist(),
        table["mode"].to_pylist(), strict=True) if mode == "step"]
    assert [(s, n) for s, n, _ in steps] == [(0, 6), (6, 6), (12, 6)]
    assert [s for s, _ in got["hooktrace/step_ms_step"]] == [5, 11, 17]
    assert [v for _, v in got["hooktrace/step_ms_step"]] == pytest.approx(
        [ms for *_, ms in steps], rel=1e-5)
    fwd = [t for t in got if t.startswith("hooktrace/fwd_ms/") and t.endswith("_step")]
    assert len(fwd) == 2 and all(len(got[t]) == 3 for t in fwd)
    # THEN the epoch series has one point per epoch, at its last step
    assert [s for s, _ in got["hooktrace/step_ms_epoch"]] == [5, 11, 17]
    assert [v for _, v in got["hooktrace/step_ms_epoch"]] == pytest.approx(
        [ms for *_, ms in steps], rel=1e-5)


def test_lightning_final_validation_is_aggregated(tmp_path: Path) -> None:
    L = pytest.importorskip("lightning")

    from hooktrace.data.aggregates import load_aggregates
    from hooktrace.integrations.lightning import HooktraceCallback

    # GIVEN 2 epochs of 3 steps, each followed by a validation of 2 batches
    callback = HooktraceCallback(tmp_path / "pl.htrace", aggregate=tmp_path / "agg",
                                 aggregate_interval=0, detail="every=0")
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False,
                        num_sanity_val_steps=0, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[callback])
    trainer.fit(_regressor(validate=True), _loader(12), _loader(8))
    # THEN both validations' calls are in the aggregates (issue #47: the last one, after
    # the last training step, never was), the last as a step of its own
    table = load_aggregates(tmp_path / "agg")
    evals = sum(c for m, mode, c in zip(table["module"].to_pylist(), table["mode"].to_pylist(),
                                        table["calls"].to_pylist(), strict=True)
                if m == "net.head" and mode == "eval")
    assert evals == 2 * 2
    step_rows = [n for mode, n in zip(table["mode"].to_pylist(), table["steps"].to_pylist(),
                                      strict=True) if mode == "step"]
    assert sum(step_rows) == 2 * 3 + 1


def _window(step: int, steps: int, fwd: dict[str, float]) -> dict[str, list[Any]]:
    """A window's aggregate rows: forward per module (ms per step) and the step row."""
    names = list(fwd)
    return {"step": [step] * (len(names) + 1), "steps": [steps] * (len(names) + 1),
            "module": names + ["<step>"], "mode": ["forward"] * len(names) + ["step"],
            "total_ms": [fwd[n] * steps for n in names] + [100.0 * steps]}


WARM_UP = {"<root>": 90.0, "layers.0": 60.0, "layers.0.attn": 40.0, "layers.1": 10.0,
           "layers.1.attn": 5.0, "layers.2": 9.0, "layers.2.attn": 4.0}
STEADY = {"<root>": 30.0, "layers.0": 5.0, "layers.0.attn": 2.0, "layers.1": 12.0,
          "layers.1.attn": 8.0, "layers.2": 11.0, "layers.2.attn": 7.0,
          "layers.2.attn.lora": 6.95, "layers.2.attn.lora.base_layer": 6.9}


def test_top_modules_are_not_chosen_from_the_warm_up_window_alone() -> None:
    from hooktrace.integrations.scalars import Scalars

    # GIVEN a first window (the warm-up: layer 0 lazy-initialises) and a steady one
    scalars = Scalars(top=3, include="layers.*")
    scalars.add(0, _window(0, 1, WARM_UP))
    assert scalars.take() == [] and scalars.modules is None  # (waits for a second window)
    scalars.add(8, _window(1, 8, STEADY))
    # THEN the modules come from the steady window, and a module whose time is nearly
    # all one submodule's (a wrapper: the same curve) is left out for it
    windows = scalars.take()
    assert scalars.modules == ["layers.1", "layers.2", "layers.1.attn"]
    assert [(last, steps) for last, steps, _ in windows] == [(0, 1), (8, 8)]
    assert windows[0][2]["hooktrace/fwd_ms/layers.1"] == 10.0  # the warm-up, logged too
    assert windows[1][2]["hooktrace/step_ms"] == 100.0
    # a run of one window: chosen from it when the trainer logs
    one = Scalars(top=1)
    one.add(0, _window(0, 1, WARM_UP))
    assert one.take(force=True)[0][0] == 0 and one.modules == ["<root>"]


def test_hf_callback_logs_modules_chosen_after_the_warm_up_weighted_by_steps(
        tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from hooktrace.integrations.hf import HooktraceCallback

    # GIVEN the HF callback's windows: the warm-up step, then 3 steps in another window
    callback = HooktraceCallback(tmp_path / "hf.htrace", aggregate=tmp_path / "agg", logs=True,
                                 log_top=2, log_include="layers.*")
    session = callback.session
    session._collect_scalars(0, _window(0, 1, WARM_UP))
    session._collect_scalars(3, _window(1, 3, STEADY))
    logs: dict[str, float] = {"loss": 1.0}
    callback.on_log(None, None, None, logs=logs)
    # THEN the modules logged are the steady window's, and each value is the mean per
    # step over the 4 steps (the warm-up window counts as 1 step, the other as 3)
    assert {k for k in logs if k.startswith("hooktrace/fwd_ms/")} == {
        "hooktrace/fwd_ms/layers.1", "hooktrace/fwd_ms/layers.2"}
    assert logs["hooktrace/fwd_ms/layers.1"] == pytest.approx((10.0 + 3 * 12.0) / 4)
    assert session.pending == []
