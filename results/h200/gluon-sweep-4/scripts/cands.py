from triton_impl.gluon.hopper import GluonConfig as C

P1 = (2, 16, 8192, 128, False)
P1C = (2, 16, 8192, 128, True)
D64 = (4, 32, 8192, 64, False)
D64C = (4, 32, 8192, 64, True)
CANDS = []
for name, cfg in [
    ("128,2,pp (default)", C(128, 2, pingpong=True)),
    ("128,3,pp", C(128, 3, pingpong=True)),
    ("128,2", C(128, 2)),
    ("128,3", C(128, 3)),
    ("64,3,pp", C(64, 3, pingpong=True)),
    ("64,4,pp", C(64, 4, pingpong=True)),
    ("64,4", C(64, 4)),
]:
    CANDS.append(("fp8 P1 " + name, "fp8", P1, cfg))
for name, cfg in [
    ("128,3 (default)", C(128, 3)),
    ("128,3,pp", C(128, 3, pingpong=True)),
    ("128,2", C(128, 2)),
    ("64,4", C(64, 4)),
]:
    CANDS.append(("fp8 P1c " + name, "fp8", P1C, cfg))
for name, cfg in [
    ("128,2,3c,pp (default)", C(128, 2, consumers=3, pingpong=True)),
    ("128,3,3c,pp", C(128, 3, consumers=3, pingpong=True)),
    ("128,2,3c", C(128, 2, consumers=3)),
    ("64,4,3c,pp", C(64, 4, consumers=3, pingpong=True)),
    ("64,3,3c,pp", C(64, 3, consumers=3, pingpong=True)),
    ("128,2,2c,pp", C(128, 2, consumers=2, pingpong=True)),
    ("128,3,2c", C(128, 3, consumers=2)),
]:
    CANDS.append(("hopper D64 " + name, "hopper", D64, cfg))
for name, cfg in [
    ("128,2,3c,pp (default)", C(128, 2, consumers=3, pingpong=True)),
    ("128,3,3c,pp", C(128, 3, consumers=3, pingpong=True)),
    ("128,2,3c", C(128, 2, consumers=3)),
]:
    CANDS.append(("hopper D64c " + name, "hopper", D64C, cfg))
for name, cfg in [
    ("128,2 (default)", C(128, 2)),
    ("128,3", C(128, 3)),
    ("128,2,pp", C(128, 2, pingpong=True)),
    ("64,4", C(64, 4)),
]:
    CANDS.append(("hopper P1 " + name, "hopper", P1, cfg))
for name, cfg in [
    ("128,3,pp", C(128, 3, pingpong=True)),
]:
    CANDS.append(("hopper P1 " + name, "hopper", P1, cfg))
for name, cfg in [
    ("128,2 (default)", C(128, 2)),
    ("128,2,pp", C(128, 2, pingpong=True)),
    ("128,3,pp", C(128, 3, pingpong=True)),
]:
    CANDS.append(("hopper P1c " + name, "hopper", P1C, cfg))
