"""The training iteration, validation and checkpoints on an emulated CUDA device (tests/fake_cuda.py): every op
checked by FakeTensorMode for device and dtype, no host read inside the iteration, and the numbers compared with
the same run on the CPU.

Not run here, and why: the fused Triton energy kernel (a Triton kernel needs device memory; it is tested in
Triton's CPU interpreter in tests/test_energy_kernel.py and against the blocked version on a GPU by
``make gpu-check``); NCCL and pinned memory (they need a driver: ``make gpu-check`` runs a 1-process NCCL job).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses

import pytest
import torch

from tests.conftest import tiny_config
from tests.fake_cuda import emulator_only, fake_cuda, needs_fake_cuda, no_sync, raises_host_sync
from wsss import losses
from wsss.config import Config
from wsss.data.transforms import PixelNormalize, backbone_mean_std
from wsss.data.voc import val_dataset
from wsss.engine.checkpoint import save_checkpoint
from wsss.engine.optim import NonFiniteGuard, NonFiniteLossError, build_optimizer
from wsss.engine.resume import restore_training_state
from wsss.engine.schedule import PolyWarmupScheduler
from wsss.engine.step import TrainingStep
from wsss.engine.train import LossMeter, iteration, to_device
from wsss.engine.validate import validate
from wsss.model_file import load_checkpoint, model_from_checkpoint
from wsss.models import WSSSModel, build_model

pytestmark = [pytest.mark.usefixtures("one_thread"), needs_fake_cuda]

CUDA, CPU = torch.device("cuda"), torch.device("cpu")
ITERATIONS = (0, 1, 2)
"""Two iterations before ``loss.seg_start_iter`` (2 in tiny_config: classification only), one after (all terms)."""


def amp_config(tmp_path, cam_dtype: str) -> Config:
    cfg = tiny_config(tmp_path, amp=True, cam_dtype=cam_dtype)
    cfg.loss.reg_kernel = "blocked"
    cfg.model.drop_path_rate = 0.0
    return cfg


def make_batch() -> dict:
    g = torch.Generator().manual_seed(1)
    return {
        "image": torch.randn(2, 3, 32, 32, generator=g),
        "label": torch.tensor([[1.0, 0.0], [1.0, 1.0]]),
        "box": torch.tensor([[3, 30, 0, 32], [0, 32, 5, 26]]),
    }


@dataclasses.dataclass
class Trained:
    model: WSSSModel
    optimizer: torch.optim.Optimizer
    scheduler: PolyWarmupScheduler
    step: TrainingStep
    history: list[dict[str, torch.Tensor]]


def train_iterations(
    cfg: Config, model: WSSSModel, device: torch.device, batch: dict, its=ITERATIONS, mode=None
) -> Trained:
    """What wsss/engine/train.py does per iteration: the batch to the device, :func:`iteration` (the step under
    autocast, the CAM pass, PAR, pseudo labels, the losses, backward, the non-finite guard, fused AdamW, the
    scheduler, the loss meter); the meter's device sums are kept per iteration. With the ``mode`` of
    :func:`fake_cuda`, the iterations (not the set-up: the model's copy to the device waits for it) run in a
    no-sync region."""
    mean, std = backbone_mean_std(cfg.model.backbone)
    raw = model.to(device).train()
    optimizer = build_optimizer(raw, cfg.optim)
    o = cfg.optim
    scheduler = PolyWarmupScheduler(optimizer, cfg.train.max_iters, o.warmup_iters, o.warmup_ratio, o.power)
    step = TrainingStep(cfg, mean, std, device)
    guard, history = NonFiniteGuard(optimizer), []
    with no_sync(mode) if mode is not None else contextlib.nullcontext():
        for it in its:
            meter = LossMeter()
            iteration(raw, raw, step, to_device(batch, device), it, optimizer, scheduler, guard, meter)
            history.append(meter.sums)
    return Trained(raw, optimizer, scheduler, step, history)


@pytest.mark.parametrize("amp", [False, True])
@pytest.mark.parametrize("cam_dtype", ["float32", "bfloat16"])
def test_the_forward_and_the_cam_pass_take_their_precisions_apart(tmp_path, amp, cam_dtype):
    """``train.amp`` autocasts the forward pass, ``train.cam_dtype`` the CAM pass, each whatever the other says, on
    CUDA only; the defaults are the reference's float32."""
    mean, std = backbone_mean_std("vit_tiny_patch16_224")
    cfg = tiny_config(tmp_path, amp=amp, cam_dtype=cam_dtype)
    with fake_cuda():
        step = TrainingStep(cfg, mean, std, CUDA)
    assert (step.amp, step.cam_autocast) == (amp, cam_dtype == "bfloat16")
    on_cpu = TrainingStep(cfg, mean, std, CPU)
    assert not on_cpu.amp and not on_cpu.cam_autocast
    default = tiny_config(tmp_path).train
    assert (default.amp, default.cam_dtype) == (False, "float32")


@pytest.mark.parametrize("cam_dtype", ["float32", "bfloat16"])
def test_training_iterations_run_on_cuda_without_a_host_sync(tmp_path, cam_dtype):
    cfg = amp_config(tmp_path, cam_dtype)
    torch.manual_seed(0)
    model, batch = build_model(cfg.model, num_classes=3), make_batch()
    on_cpu = train_iterations(cfg, copy.deepcopy(model), CPU, batch)
    with fake_cuda() as mode:
        on_cuda = train_iterations(cfg, copy.deepcopy(model), CUDA, batch, mode=mode)
        assert on_cuda.step.amp and on_cuda.step.cam_autocast == (cam_dtype == "bfloat16")
        assert not on_cpu.step.amp  # autocast runs on CUDA only
        terms = [{"cls", "aux", "loss"}] * 2 + [{"cls", "aux", "seg", "reg", "loss"}]  # seg_start_iter 2
        assert [set(h) for h in on_cuda.history] == terms
        for sums in on_cuda.history:
            assert all(v.device.type == "cuda" and v.dtype == torch.float32 for v in sums.values())
        params = list(on_cuda.model.parameters())
        assert all(p.device.type == "cuda" for p in params)
        assert all(s.device.type == "cuda" for st in on_cuda.optimizer.state.values() for s in st.values())
        cuda_terms = [{k: v.item() for k, v in h.items()} for h in on_cuda.history]
        cuda_weights = [p.detach().cpu() for p in params]
    cpu_terms = [{k: v.item() for k, v in h.items()} for h in on_cpu.history]
    for got, want in zip(cuda_terms, cpu_terms, strict=True):  # bf16 autocast against float32
        assert got == pytest.approx(want, rel=0.02, abs=1e-6)
    trained = [p.requires_grad for p in on_cpu.model.parameters()]
    start = [p.detach() for p in model.parameters()]
    moved_cuda = torch.cat([(w - s).flatten() for w, s, t in zip(cuda_weights, start, trained, strict=True) if t])
    moved_cpu = torch.cat([(w.detach() - s).flatten() for w, s, t in zip(on_cpu.model.parameters(), start, trained,
                                                                           strict=True) if t])  # fmt: skip
    # the same updates up to bf16 rounding: AdamW's step is about lr per weight whatever the gradient's size
    assert torch.nn.functional.cosine_similarity(moved_cuda, moved_cpu, dim=0) > 0.9
    assert moved_cuda.norm() == pytest.approx(moved_cpu.norm().item(), rel=0.1)
    frozen = [w for w, t in zip(cuda_weights, trained, strict=True) if not t]
    assert frozen and all(torch.equal(w, s) for w, s, t in zip(cuda_weights, start, trained, strict=True) if not t)


def test_the_loaders_uint8_crops_are_normalised_on_the_device_without_a_host_sync():
    """tools/train.py's batch: uint8 crops uploaded (a quarter of the float's bytes) and normalised by table there
    (PixelNormalize, its table uploaded once when made), without the host waiting, equal to the CPU's."""
    mean, std = backbone_mean_std("vit_tiny_patch16_224")
    g = torch.Generator().manual_seed(0)
    batch = {**make_batch(), "image": torch.randint(0, 256, (2, 3, 32, 32), generator=g, dtype=torch.uint8)}
    on_cpu = to_device(batch, CPU, PixelNormalize(mean, std, CPU))["image"]
    with fake_cuda() as mode:
        normalize = PixelNormalize(mean, std, CUDA)
        with no_sync(mode):
            on_cuda = to_device(batch, CUDA, normalize)["image"]
        assert on_cuda.device.type == "cuda" and on_cuda.dtype == torch.float32
        got = on_cuda.cpu()
    assert torch.equal(got, on_cpu)


def test_a_non_finite_loss_skips_the_update_on_the_device(tmp_path):
    """The guard's flag is set on the device and fused AdamW honours it: no weight moves, nothing is read back
    until raise_if_tripped."""
    cfg = amp_config(tmp_path, "bfloat16")
    torch.manual_seed(0)
    model = build_model(cfg.model, num_classes=3)
    batch = make_batch()
    batch["image"][0, 0, 0, 0] = float("nan")
    with fake_cuda() as mode:
        run = train_iterations(cfg, copy.deepcopy(model), CUDA, batch, its=(0,), mode=mode)
        guard = NonFiniteGuard(run.optimizer)
        guard.first_step.fill_(0)
        with pytest.raises(NonFiniteLossError, match="iteration 0"):
            guard.raise_if_tripped(None)
        for got, want in zip(run.model.parameters(), model.parameters(), strict=True):
            assert torch.equal(got.detach().cpu(), want.detach())


def test_the_emulated_step_catches_a_tensor_made_on_the_cpu(tmp_path, monkeypatch):
    """A planted ``torch.arange`` without ``device=`` in the pseudo-label path fails under fake CUDA (and passes on
    the CPU, which is why the CPU suite cannot see it)."""
    from wsss import pseudo_label

    original = pseudo_label.boxes_to_mask

    def planted(boxes, height, width):
        return original(boxes, height, width) & (torch.arange(width) >= 0)  # on the CPU

    monkeypatch.setattr(pseudo_label, "boxes_to_mask", planted)
    monkeypatch.setattr("wsss.engine.step.boxes_to_mask", planted)
    cfg = amp_config(tmp_path, "float32")
    model = build_model(cfg.model, num_classes=3)
    train_iterations(cfg, copy.deepcopy(model), CPU, make_batch())
    with fake_cuda() as mode, pytest.raises(RuntimeError, match="cuda:0 and cpu|cpu and cuda:0|cuda:0, cpu"):
        train_iterations(cfg, copy.deepcopy(model), CUDA, make_batch(), mode=mode)


def test_the_emulated_step_catches_a_host_read(tmp_path, monkeypatch):
    """A planted ``.item()`` in the iteration (here in the balanced CE) raises inside the no-sync region."""
    original = losses.balanced_seg_ce

    def planted(seg_logits, pseudo_label, ignore_index):
        loss = original(seg_logits, pseudo_label, ignore_index)
        return loss * (1.0 if loss.item() >= 0 else 1.0)

    monkeypatch.setattr("wsss.engine.step.balanced_seg_ce", planted)
    cfg = amp_config(tmp_path, "float32")
    model = build_model(cfg.model, num_classes=3)
    train_iterations(cfg, copy.deepcopy(model), CPU, make_batch())
    with fake_cuda() as mode, raises_host_sync("_local_scalar_dense"):
        train_iterations(cfg, copy.deepcopy(model), CUDA, make_batch(), mode=mode)


def test_the_emulated_step_catches_a_float32_meeting_bf16(tmp_path, monkeypatch):
    """A planted matmul of the logits with a float32 tensor, outside autocast: under CUDA's bf16 autocast the logits
    are bf16 and the matmul fails; on the CPU, where autocast is off, it passes."""
    from wsss.models import segmentor

    original = segmentor.WSSSModel.forward

    def planted(self, x, *args, **kwargs):
        out = original(self, x, *args, **kwargs)
        with torch.autocast(x.device.type, enabled=False):  # the bf16 logits meet a float32 tensor in a matmul
            out.logits = out.logits @ torch.eye(out.logits.shape[1], device=x.device)
        return out

    monkeypatch.setattr(segmentor.WSSSModel, "forward", planted)
    cfg = amp_config(tmp_path, "float32")
    model = build_model(cfg.model, num_classes=3)
    train_iterations(cfg, copy.deepcopy(model), CPU, make_batch())
    with fake_cuda() as mode, pytest.raises(RuntimeError, match="dtype"):
        train_iterations(cfg, copy.deepcopy(model), CUDA, make_batch(), mode=mode)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_auto_energy_kernel_is_the_fused_one_exactly_on_cuda(monkeypatch, device):
    """``loss.reg_kernel="auto"`` calls the Triton kernel for CUDA tensors and the blocked version otherwise. The
    kernel itself cannot run on emulated tensors (Triton needs device memory); a stand-in records the call."""
    calls = []

    def fused(features, values):
        calls.append(features.device.type)
        return losses.gaussian_filter_dense(features, values)

    monkeypatch.setattr(losses.energy_kernel, "gaussian_filter_fused", fused)
    g = torch.Generator().manual_seed(0)
    features, values = torch.randn(50, 5, generator=g), torch.rand(50, 3, generator=g)
    with fake_cuda():
        out = losses.gaussian_filter(features.to(device), values.to(device), "auto", None)
        assert out.device.type == device
        got = out.cpu()
    assert calls == (["cuda"] if device == "cuda" else [])
    torch.testing.assert_close(got, losses.gaussian_filter_dense(features, values))


def test_validation_of_a_cuda_model_equals_the_cpu(tiny_voc, tmp_path):
    cfg = tiny_config(tiny_voc)
    mean, std = backbone_mean_std(cfg.model.backbone)
    torch.manual_seed(0)
    model = build_model(cfg.model, num_classes=3)
    val_set = val_dataset(cfg.data, mean, std)
    on_cpu = validate(copy.deepcopy(model), val_set, cfg, CPU)
    with fake_cuda():
        on_cuda = validate(copy.deepcopy(model).to(CUDA), val_set, cfg, CUDA)
    assert on_cuda.metrics == on_cpu.metrics
    assert on_cuda.pictures.keys() == on_cpu.pictures.keys()
    for name, picture in on_cuda.pictures.items():
        assert (picture == on_cpu.pictures[name]).all()


@emulator_only
def test_validation_waits_for_the_device_only_for_its_pictures(tiny_voc):
    """Per image scored (no pictures), no host sync: the labels from the mask on the host, uploads through
    to_device, the confusion counts without bincount."""
    cfg = tiny_config(tiny_voc)
    mean, std = backbone_mean_std(cfg.model.backbone)
    torch.manual_seed(0)
    model = build_model(cfg.model, num_classes=3)
    val_set = val_dataset(cfg.data, mean, std)
    assert len(val_set) >= 2
    syncs = []
    for images in (1, 2):
        with fake_cuda() as mode:
            validate(copy.deepcopy(model).to(CUDA), val_set, cfg, CUDA, max_images=images, num_pictures=0)
        syncs.append(len(mode.syncs))
    assert syncs[1] == syncs[0], syncs


def test_a_cuda_checkpoint_saves_from_the_cpu_and_loads_back_onto_cuda(tmp_path):
    cfg = amp_config(tmp_path, "bfloat16")
    torch.manual_seed(0)
    model = build_model(cfg.model, num_classes=3)
    mean, std = backbone_mean_std(cfg.model.backbone)
    path = tmp_path / "iter_3.pth"
    with fake_cuda() as mode:
        run = train_iterations(cfg, copy.deepcopy(model), CUDA, make_batch())
        with no_sync(mode), raises_host_sync():  # saving reads the device: never inside the iteration
            save_checkpoint(path, run.model, cfg, ["background", "cat", "dog"], mean, std, 3, run.optimizer)
        save_checkpoint(path, run.model, cfg, ["background", "cat", "dog"], mean, std, 3, run.optimizer)
        saved = [p.detach().cpu() for p in run.model.parameters()]
        moments = [s["exp_avg"].cpu() for s in run.optimizer.state.values()]
        ckpt = load_checkpoint(path)  # on the CPU, every tensor (no cuda storage in the file)
        tensors = [*ckpt["model"].values(), *(v for s in ckpt["optimizer"]["state"].values() for v in s.values())]
        assert all(t.device.type == "cpu" for t in tensors)

        loaded, _ = model_from_checkpoint(path, CUDA)  # inference: rebuilt on cuda
        assert all(p.device.type == "cuda" for p in loaded.parameters())
        for got, want in zip(loaded.parameters(), saved, strict=True):
            assert torch.equal(got.detach().cpu(), want)

        resumed = train_iterations(cfg, copy.deepcopy(model), CUDA, make_batch(), its=())  # resume: cpu -> cuda
        restore_training_state(ckpt, path, resumed.model, resumed.optimizer, resumed.scheduler, ckpt["classes"])
        state = list(resumed.optimizer.state.values())
        assert all(v.device.type == "cuda" for s in state for v in s.values())  # fused AdamW: step too
        for got, want in zip(state, moments, strict=True):
            assert torch.equal(got["exp_avg"].cpu(), want)
