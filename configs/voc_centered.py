# The paper: DeiT-S with centered self-attention (gamma = -1) in every block, trained on VOC 2012 + SBD
# (train_aug) for 80k iterations, batch 4, crops of 448. Every other value is the default of wsss/config/schema.py:
# the paper's recipe, and ToCo's released one where the paper is silent (docs/reference.md lists them).
# The work dir's config.py holds every resolved value.
# train.batch_size (4) is per process: torchrun multiplies it by the number of GPUs. The paper's batch 4 is
# train.batch_size=4 on 1 GPU, 2 on 2 GPUs (ToCo's run, 2 x 2), 1 on 4 (docs/reference.md, row 13).
# optim.warmup_iters is the paper's 2500; ToCo's script and logs use 1500: --cfg-options optim.warmup_iters=1500.
model = dict(attention=dict(name="centered"))
work_dir = "work_dirs/voc_centered"
