from triton_impl.gluon.hopper import GluonConfig as C

P1 = (2, 16, 8192, 128, False)
P1C = (2, 16, 8192, 128, True)
D64 = (4, 32, 8192, 64, False)
D64C = (4, 32, 8192, 64, True)
CANDS = []
for label, shape, cfg in [
    ("fp8 P1 128,2,pp", P1, C(128, 2, pingpong=True)),
    ("fp8 P1c 128,3", P1C, C(128, 3)),
    ("fp8 D64 128,3", D64, C(128, 3)),
    ("fp8 D64c 128,3", D64C, C(128, 3)),
]:
    for tree in (False, True):
        CANDS.append(
            (f"{label} tree={tree}", "fp8", shape, C(cfg.block_n, cfg.num_stages, cfg.consumers, cfg.pingpong, tree))
        )
