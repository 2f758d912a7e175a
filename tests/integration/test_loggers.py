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
