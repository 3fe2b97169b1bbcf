# DeiT-S/16 from timm, ImageNet-pretrained; aux classifier on block -3; LargeFOV decoder.
model = dict(
    backbone="deit_small_patch16_224",
    pretrained="hub",
    drop_path_rate=0.1,
    aux_layer=-3,
    decoder_channels=512,
    decoder_dilation=5,
)
