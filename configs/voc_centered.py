# The paper: DeiT-S with centered self-attention (gamma = -1) in every block.
_base_ = ["_base_/voc.py", "_base_/deit_s.py", "_base_/schedule_80k.py"]

model = dict(attention=dict(name="centered", gamma=-1.0, blocks=None))
work_dir = "work_dirs/voc_centered"
