# Ablation: the same pipeline with timm's plain self-attention.
_base_ = ["voc_centered.py"]

model = dict(attention=dict(name="vanilla"))
work_dir = "work_dirs/voc_vanilla"
