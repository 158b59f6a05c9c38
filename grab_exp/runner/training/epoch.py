"""One training epoch and its metrics row; the step loop never reads the device on the host."""

from __future__ import annotations

import math
import resource
import time
from typing import Any

import torch

from grab_exp.runner.training.build import TrainingJob
from grab_exp.runner.training.capture import CapturedStep
from grab_exp.runner.training.progress import Progress
from grab_exp.runner.training.signals import check_stop
from grab_exp.runner.training.step import train_step


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cuda_peaks_mb(
    device: torch.device, start_bytes: int, captured: CapturedStep | None
) -> tuple[float | None, ...]:
    """``(absolute peak, peak above the epoch start)`` of CUDA allocations since the epoch's
    reset, in MiB; ``(None, None)`` off CUDA.

    The absolute peak holds what lived before the epoch (the dataset when it is on the GPU,
    the model, the optimizer's and the ordering's state); the step peak is what training
    steps allocated on top of it (activations, per-sample gradients, the ordering's work). A
    captured step's replays allocate from the graph's private pool, which the counters do not
    see: its working memory is the one its capture measured.
    """
    if device.type != "cuda":
        return None, None
    peak = torch.cuda.max_memory_allocated(device)
    if captured is not None and captured.step_peak_bytes is not None:
        peak = max(peak, captured.take_peak_before(), start_bytes + captured.step_peak_bytes)
    return peak / 2**20, (peak - start_bytes) / 2**20


def train_steps(job: TrainingJob, progress: Progress) -> tuple[torch.Tensor, int]:
    """One pass over the ordering; returns (summed step loss on the device, steps).

    With ``job.captured`` (``trainer.cuda_graph``) every full batch runs the captured step; the
    epoch's last, shorter one runs eagerly.
    """
    data, ordering, captured = job.data, job.parts.ordering, job.captured
    loss_sum = torch.zeros((), device=job.strategy.device)
    steps = 0
    for indices in job.strategy.index_batches(ordering, job.batch_size):
        check_stop()  # a step boundary: SIGTERM / SIGINT stop here
        x, y = data.train_x[indices], data.train_y[indices]  # (B, 3, 32, 32), (B,)
        if captured is not None and len(indices) == job.batch_size:
            loss = captured(x, y, indices)
        else:
            loss = train_step(job.parts, x, y, indices)
        loss_sum += loss
        steps += 1
        progress.step(loss)
    return loss_sum, steps


def _evaluation(job: TrainingJob) -> dict[str, float]:
    data, model, strategy, loss = job.data, job.parts.model, job.strategy, job.parts.loss
    row = {}
    for split, x, y in (("train", data.train_x, data.train_y), ("test", data.test_x, data.test_y)):
        mean, acc = strategy.evaluate(model, x, y, job.eval_batch_size, loss.total)
        row |= {f"{split}/loss": mean, f"{split}/acc": acc}
        if loss.perplexity:
            row[f"{split}/ppl"] = math.exp(min(mean, 700.0))  # exp overflows a float past ~709
    return row


def run_epoch(job: TrainingJob, epoch: int, progress: Progress) -> dict[str, Any]:
    """Train epoch ``epoch`` (0-based), then evaluate; returns the epoch's metrics row.

    The row's ``epoch`` is the number of completed epochs (``epoch + 1``).
    """
    device, ordering, strategy = job.strategy.device, job.parts.ordering, job.strategy
    ordering.set_epoch(epoch)
    strategy.start_epoch(ordering)
    start_bytes = 0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        start_bytes = torch.cuda.memory_allocated(device)
    _synchronize(device)
    started = time.perf_counter()
    progress.start_epoch(epoch, -(-len(ordering) // job.batch_size))
    loss_sum, steps = train_steps(job, progress)
    _synchronize(device)
    seconds = time.perf_counter() - started
    peak_cuda, step_peak_cuda = _cuda_peaks_mb(device, start_bytes, job.captured)
    row = {
        "epoch": epoch + 1,
        **_evaluation(job),
        **strategy.end_epoch(job.parts.model, ordering, loss_sum, steps),
        "time/epoch_s": seconds,
        "mem/peak_cuda_mb": peak_cuda,
        "mem/step_peak_cuda_mb": step_peak_cuda,
        "mem/peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "mem/sorter_bytes": ordering.state_bytes(),
    }
    if job.parts.uses_gsnr:
        row.update(job.parts.optimizer.clip_fractions())  # one host read; resets the counters
    progress.end_epoch(row)
    return row
