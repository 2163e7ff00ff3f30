"""A round's clients trained together (``training.clients_at_once``): one vectorised SGD over their
stacked parameters, with the semantics of training each alone (:meth:`sim.learning.trainer.Learner.local_update`).

Each client of a group of G keeps its own copy of the parameters (and momentum buffer): a leading
dimension of G on every tensor. One step computes every client's gradient on its own mini-batch at once
(torch.func: :func:`~torch.func.functional_call` of the model on a client's parameters, :func:`~torch.func.grad`
of its loss, :func:`~torch.func.vmap` over the clients) and applies torch's SGD update (``torch.optim.SGD``,
no dampening, no Nesterov) to each copy:

    g <- grad + weight_decay * p;   b <- momentum * b + g  (b = g at the first step);   p <- p - lr * b

What makes it the loop's training and not an approximation of it:

- **Each client's own batches.** Its mini-batches are drawn exactly as the loop draws them: per epoch a
  permutation ``torch.randperm(n, generator)`` of its n samples from its ``TRAINING`` stream of the round,
  cut into batches of ``batch_size`` (:func:`schedule`).
- **Unequal sizes.** A client with fewer steps than the group's longest (fewer samples) stops when its own
  schedule ends: from then on its parameters and momentum are left unchanged (a mask per client and step).
- **A partial last batch** is padded to ``batch_size`` with weight-0 samples; the loss is the weighted mean
  ``sum(w_i * loss_i) / sum(w_i)``, the mean over the batch's real samples, as the loop's
  ``CrossEntropyLoss`` takes. The built-in models normalise per sample (GroupNorm, no batch statistics),
  so padding changes nothing of the real samples' outputs.
- **Local epochs, momentum, weight decay** are per client: nothing is shared across the group.

The results equal the loop's within float tolerance, not always bit for bit: the vectorised kernels
(grouped convolutions, batched matrix products) may sum in another order. docs/performance.md, section 8,
states the tolerance measured for every built-in model (tests/test_together.py checks it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn.utils import parameters_to_vector

from sim.errors import InputError
from sim.learning.device import free_bytes
from sim.learning.flops import activations_per_sample, module_multiply_adds
from sim.scenario.types import Training
from sim.seeds import Stream, int_seed


@dataclass(frozen=True)
class Schedule:
    """One client's local training: the sample indices of each of its optimizer steps, in order."""

    client: int
    samples: int
    steps: tuple[torch.Tensor, ...]
    """Each step's mini-batch: indices into the client's samples (the last of an epoch may be shorter)."""


def schedule(client: int, samples: int, training: Training, seed: int, round: int) -> Schedule:
    """The mini-batches the loop would train ``client`` on in ``round``: per local epoch a permutation of its
    ``samples`` from its ``TRAINING`` stream (``torch.randperm`` on a CPU generator), cut into batches."""
    order = torch.Generator().manual_seed(int_seed(seed, Stream.TRAINING, round, client))
    steps: list[torch.Tensor] = []
    for _ in range(training.local_epochs):
        perm = torch.randperm(samples, generator=order)
        steps += [perm[start : start + training.batch_size] for start in range(0, samples, training.batch_size)]
    return Schedule(client, samples, tuple(steps))


def _padded_plan(plans: Sequence[Schedule], batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The group's steps as tensors: indices ``(S, G, batch)`` (padding points at sample 0), weights
    ``(S, G, batch)`` (1 for a real sample, 0 for padding) and ``active`` ``(S, G)`` (the client still trains),
    S the longest schedule. Filled in numpy (a few microseconds a step, not a torch call per slice)."""
    longest = max(len(p.steps) for p in plans)
    index = np.zeros((longest, len(plans), batch), dtype=np.int64)
    weight = np.zeros((longest, len(plans), batch), dtype=np.float32)
    active = np.zeros((longest, len(plans)), dtype=np.bool_)
    for g, plan in enumerate(plans):
        for s, step in enumerate(plan.steps):
            n = step.shape[0]
            index[s, g, :n] = step.numpy()
            weight[s, g, :n] = 1.0
        active[: len(plan.steps), g] = True
    return torch.from_numpy(index), torch.from_numpy(weight), torch.from_numpy(active)


class NotTogetherError(Exception):
    """Why a model cannot train together with the one-at-a-time loop's results."""


class TogetherTrainer:
    """Trains groups of clients of one model together on one device (its parameters' device)."""

    def __init__(self, model: nn.Module, training: Training) -> None:
        self.model = model
        self.training = training
        named = list(model.named_parameters())
        self.names = [name for name, _ in named]
        """Every parameter, in the order of the flat vector."""
        self.shapes = [p.shape for _, p in named]
        self.sizes = [p.numel() for _, p in named]
        self.trained = [name for name, p in named if p.requires_grad]
        """The parameters SGD steps: those the loop's optimizer gets a gradient for (:meth:`check` leaves
        out those the loss does not use); the rest stay the global model's, shared by the group."""
        self._gradients = vmap(grad(self._loss), in_dims=(0, None, 0, 0, 0))

    def _loss(
        self,
        params: dict[str, torch.Tensor],
        fixed: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        w: torch.Tensor,
    ) -> torch.Tensor:
        """One client's loss on its mini-batch: the mean cross-entropy over its real samples (weight 1)."""
        out = functional_call(self.model, (params, fixed), (x,))
        losses = nn.functional.cross_entropy(out, y, reduction="none")
        return (losses * w).sum() / w.sum().clamp_min(1.0)

    def check(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Raise :class:`NotTogetherError` (or what vectorising raises: in-place buffer updates, data-dependent
        control flow, random layers) if this model cannot train together with the loop's results, tried on
        ``x``, ``y`` (a few samples): a sample's output must not depend on the rest of its batch (batch
        statistics would see a padded batch's padding), and one step of two copies must vectorise. Finds
        the parameters the loss leaves without a gradient (:attr:`trained`). Torch's random state is
        left as it was."""
        self.model.train()
        devices = [x.device] if x.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            wanted = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
            loss = nn.functional.cross_entropy(self.model(x), y)
            found = torch.autograd.grad(loss, [p for _, p in wanted], allow_unused=True)
            self.trained = [n for (n, _), g in zip(wanted, found, strict=True) if g is not None]
            batched = (
                "a sample's output depends on the rest of its batch (batch statistics, e.g. BatchNorm), so the "
                "padding of a short batch would change it"
            )
            with torch.no_grad():
                probe = torch.cat([x[:1], x[:1].flip(-1) * 0.5 + 1.0])
                try:
                    alone, joint = self.model(probe[:1]), self.model(probe)[:1]
                except Exception as exc:  # e.g. batch normalisation refusing a batch of one
                    raise NotTogetherError(f"{batched}: {type(exc).__name__}: {exc}") from exc
            if not torch.allclose(alone, joint, rtol=1e-4, atol=1e-6):
                raise NotTogetherError(batched)
            params, fixed = self._split(parameters_to_vector(self.model.parameters()).detach(), 2)
            xs, ys = x.unsqueeze(0).expand(2, *x.shape), y.unsqueeze(0).expand(2, *y.shape)
            self._gradients(params, fixed, xs, ys, torch.ones(ys.shape, device=ys.device))

    def _split(self, flat: torch.Tensor, g: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The flat global parameters as ``g`` stacked copies of those SGD steps, and the rest once."""
        params: dict[str, torch.Tensor] = {}
        fixed: dict[str, torch.Tensor] = {}
        trained = set(self.trained)
        for name, shape, piece in zip(self.names, self.shapes, flat.split(self.sizes), strict=True):
            if name in trained:
                params[name] = piece.reshape(shape).unsqueeze(0).expand(g, *shape).clone()
            else:
                fixed[name] = piece.reshape(shape)
        return params, fixed

    def train(
        self, global_params: torch.Tensor, xs: torch.Tensor, ys: torch.Tensor, plans: Sequence[Schedule]
    ) -> torch.Tensor:
        """Train the group from the flat ``global_params`` (on the device); ``xs`` ``(G, n_max, *input)`` and
        ``ys`` ``(G, n_max)`` hold each client's samples (padded to the largest), ``plans`` their schedules.
        Returns the updates ``theta_local - theta_global``, ``(G, dim)`` float32 on the device."""
        t, device, g = self.training, global_params.device, len(plans)
        self.model.train()
        index, weight, active = (a.to(device) for a in _padded_plan(plans, t.batch_size))
        every = bool(active.all())
        rows = torch.arange(g, device=device).unsqueeze(1)
        params, fixed = self._split(global_params, g)
        buffers = {name: torch.zeros_like(p) for name, p in params.items()} if t.momentum else {}
        for s in range(index.shape[0]):
            idx = index[s]
            grads = self._gradients(params, fixed, xs[rows, idx], ys[rows, idx], weight[s])
            on = None if every else active[s]
            for name in self.trained:
                p, step = params[name], grads[name]  # step: this step's own fresh tensor
                if on is None:  # every client steps: in place, as torch.optim.SGD does
                    if t.weight_decay:
                        step.add_(p, alpha=t.weight_decay)
                    if t.momentum:
                        step = buffers[name].mul_(t.momentum).add_(step)
                    p.add_(step, alpha=-t.lr)
                    continue
                keep = on.view(_mask(g, p))
                if t.weight_decay:
                    step.add_(p, alpha=t.weight_decay)
                if t.momentum:
                    b = buffers[name].mul(t.momentum).add_(step)
                    step = buffers[name] = torch.where(keep, b, buffers[name])
                params[name] = torch.where(keep, p.add(step, alpha=-t.lr), p)
        local = torch.cat(
            [params[n].reshape(g, -1) if n in params else fixed[n].reshape(1, -1).expand(g, -1) for n in self.names],
            dim=1,
        )
        return local - global_params.unsqueeze(0)


def _mask(g: int, p: torch.Tensor) -> tuple[int, ...]:
    """The shape that broadcasts a per-client mask over the stacked tensor ``p``."""
    return (g, *([1] * (p.dim() - 1)))


def group_sizes(clients: int, at_once: int) -> list[int]:
    """Sizes of the groups that train ``clients`` at most ``at_once`` at a time, as equal as possible."""
    groups = math.ceil(clients / at_once)
    base, extra = divmod(clients, groups)
    return [base + (1 if i < extra else 0) for i in range(groups)]


STATE_COPIES = 5
"""Parameter-sized float32 tensors a client holds while training together: its parameters, gradient,
momentum buffer and two temporaries of the update."""
ACTIVATION_COPIES = 3
"""Activation-sized tensors per sample and layer kept for the backward pass and its gradients."""


def bytes_per_client(model: nn.Module, input_shape: tuple[int, ...], batch: int, samples: int) -> int:
    """An estimate of the memory one client takes when trained together: :data:`STATE_COPIES` copies of
    its parameters, :data:`ACTIVATION_COPIES` of a mini-batch's activations and its samples (float32)."""
    params = sum(p.numel() for p in model.parameters())
    sample = math.prod(input_shape)
    acts = activations_per_sample(model, input_shape)
    return 4 * (STATE_COPIES * params + ACTIVATION_COPIES * batch * (acts + sample) + samples * sample)


CPU_STEP_LIMIT = 2.0e7
"""On the CPU, ``clients_at_once: auto`` trains clients together when a mini-batch's forward pass takes at
most this many multiply-adds (per-sample multiply-adds times ``batch_size``), else one at a time. Measured
by benchmarks/training.py on the 2-core host (docs/performance.md, section 8): together wins where the loop's
per-step overhead (tens of kernel launches and the optimizer's Python) outweighs the arithmetic, e.g.
``cnn`` on 8x8 (3.4 x 10^6 per batch of 10) and ``mlp`` on 28x28; one at a time wins where the arithmetic
dominates and torch's grouped convolutions are slower than its dense ones, e.g. ``cnn`` on 28x28
(2.4 x 10^8 per batch of 20)."""
MEMORY_SHARE = 0.5
"""The share of the device's free memory (:func:`sim.learning.device.free_bytes`) a group may take."""
MAX_AT_ONCE = 4096
"""The most clients in one group. The memory's limit is rounded down to a power of two, at most this: the
free memory changes from run to run, and the groups (so the last bits of the updates) should not, so a
run's groups change only when its free memory halves or doubles, and never for rounds of up to this many
clients where they fit with room to spare."""


@dataclass(frozen=True)
class Together:
    """How a run trains a round's clients: ``at_once`` at a time (1: one at a time), and why."""

    at_once: int
    why: str
    trainer: TogetherTrainer | None = field(default=None, compare=False, repr=False)
    """The trainer that checked the model (None: one at a time)."""


def choose_together(
    model: nn.Module,
    input_shape: tuple[int, ...],
    sample: tuple[torch.Tensor, torch.Tensor],
    training: Training,
    device: torch.device,
    described: str,
    largest: int,
    workers: int = 1,
) -> Together:
    """How many clients train at once under ``training.clients_at_once`` (None: ``auto``): 1 when asked, or
    when ``auto`` finds the model cannot be vectorised (tried on ``sample``, a few samples on the device) or
    the CPU rule (:data:`CPU_STEP_LIMIT`) says one at a time is faster; else as many as asked (``auto``:
    all) up to what fits in :data:`MEMORY_SHARE` of the device's free memory, ``largest`` the most samples
    a client holds (``workers`` processes that each train: a share of that each). Raises
    :class:`InputError` for an explicit N > 1 with a model that cannot be vectorised, and when not even one
    client fits."""
    asked = training.clients_at_once
    if asked == 1:
        return Together(1, "training.clients_at_once is 1: one at a time")
    trainer = TogetherTrainer(model, training)
    try:
        trainer.check(*sample)
    except Exception as exc:
        detail = str(exc) if isinstance(exc, NotTogetherError) else f"torch.func.vmap: {type(exc).__name__}: {exc}"
        why = f"{described} cannot be trained together ({detail})"
        if asked is not None:
            raise InputError(f"training.clients_at_once: {asked}: {why}; set it to 1 or auto") from exc
        return Together(1, f"auto: {why}; one at a time")
    try:
        macs = module_multiply_adds(model, input_shape)
        need = bytes_per_client(model, input_shape, training.batch_size, largest)
    except Exception as exc:  # a plug-in's forward pass that the meta device cannot run
        why = f"{described}'s size could not be counted on the meta device ({type(exc).__name__}: {exc})"
        if asked is None:
            return Together(1, f"auto: {why}; one at a time")
        return Together(
            asked, f"training.clients_at_once is {asked}; {why}, so groups are not sized to the memory", trainer
        )
    if asked is None and device.type == "cpu" and macs * training.batch_size > CPU_STEP_LIMIT:
        return Together(
            1,
            f"auto: on the CPU a batch of {training.batch_size} takes {macs * training.batch_size:.3g} multiply-adds, "
            f"over {CPU_STEP_LIMIT:.3g}: one at a time is faster",
        )
    free = free_bytes(device)
    share = MEMORY_SHARE / workers
    room = int(free * share) // need
    fits = min(MAX_AT_ONCE, 1 << (room.bit_length() - 1)) if room >= 1 else 0  # see MAX_AT_ONCE
    if fits < 1:
        raise InputError(
            f"model {described}: training one client together with others takes about {need / 2**30:.2f} GiB "
            f"(batch_size {training.batch_size}, {largest} samples), more than {share:.0%} of the "
            f"{free / 2**30:.2f} GiB free on {device}; lower training.batch_size or set training.clients_at_once: 1"
        )
    if asked is None:
        return Together(
            fits, f"auto: together, up to {fits} at once (memory: about {need / 2**20:.1f} MiB each)", trainer
        )
    if asked > fits:
        return Together(fits, f"{asked} asked; {fits} fit in memory (about {_size(need)} each)", trainer)
    return Together(asked, f"training.clients_at_once is {asked}", trainer)


def _size(nbytes: int) -> str:
    """Bytes as a person reads them: KiB below a MiB, MiB below a GiB, else GiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes / 2**10:.1f} KiB"
