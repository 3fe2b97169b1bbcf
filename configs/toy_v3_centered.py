# Toy set v3 (class = shape and fill, colours shared by every class): the CPU demo's recipe on a backbone
# pre-trained by configs/toy_v3_pretrain.py (tools/pretrain.py), since from scratch the v3 classifier stays at
# the label prior within a CPU budget (docs/ablations.md, "Toy set v3": every trial with its numbers).
#   python tools/make_toy_voc.py data/toy_v3 --version 3
#   python tools/make_cls_labels.py data/toy_v3 --classes data/toy_v3/classes.txt --mask-dir SegmentationClass
#   python tools/pretrain.py configs/toy_v3_pretrain.py
#   python tools/train.py configs/toy_v3_centered.py
_base_ = ["toy_centered.py"]

# No blur: in v3 the fill's texture is half of what tells a class.
data = dict(root="data/toy_v3", blur_prob=0.0)
model = dict(backbone_kwargs=dict(depth=6), pretrained="work_dirs/toy_v3_pretrain/backbone.pth")
# Fine-tuning rates, as the reference fine-tunes ImageNet weights (backbone low, heads x10): the demo's 1e-3 on
# every parameter is the rate at which pre-training never left chance (docs/ablations.md, p06).
optim = dict(lr=1e-4, head_lr_mult=10.0)
work_dir = "work_dirs/toy_v3_centered"
