# The paper: DeiT-S with centered self-attention (gamma = -1) in every block, trained on VOC 2012 + SBD
# (train_aug) for 80k iterations, batch 4, crops of 448. Every other value is the default of wsss/config.py:
# the paper's recipe, and ToCo's released one where the paper is silent (docs/reference.md lists them).
# The work dir's config.py holds every resolved value.
model = dict(attention=dict(name="centered"))
work_dir = "work_dirs/voc_centered"
