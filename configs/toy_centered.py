# CPU-sized demo (make demo): a 6-block ViT-Tiny trained from scratch on the toy dataset, centered attention
# in every block. Scaled down from the paper's setting so that it trains in minutes on 2 CPU cores: one CAM
# scale (with flip), PAR with dilations up to 8 and the energy loss at quarter resolution.
_base_ = ["_base_/toy.py"]

model = dict(
    backbone="vit_tiny_patch16_224",
    backbone_kwargs=dict(depth=6),
    pretrained="",
    drop_path_rate=0.0,
    attention=dict(name="centered", gamma=-1.0),
    aux_layer=-3,
    decoder_channels=128,
    decoder_dilation=2,
)
cam = dict(scales=(1.0,))
par = dict(dilations=(1, 2, 4, 8))
optim = dict(lr=1e-3, head_lr_mult=1.0, warmup_iters=100)
loss = dict(seg_start_iter=300, reg_scale=0.25)
train = dict(max_iters=600, batch_size=8, val_interval=600, ckpt_interval=200, log_interval=20)
work_dir = "work_dirs/toy_centered"
