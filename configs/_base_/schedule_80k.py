# The paper's schedule: AdamW, warm-up 2500 iterations, poly decay, batch 4, 80k iterations.
optim = dict(lr=6e-5, head_lr_mult=10.0, weight_decay=0.01, warmup_iters=2500, warmup_ratio=1e-6, power=0.9)
train = dict(max_iters=80000, batch_size=4, val_interval=5000, ckpt_interval=5000, log_interval=50)
loss = dict(aux_weight=1.0, seg_weight=0.1, reg_weight=0.05, seg_start_iter=2000)
