# Ablation of the demo: plain attention.
_base_ = ["toy_centered.py"]

model = dict(attention=dict(name="vanilla"))
work_dir = "work_dirs/toy_vanilla"
