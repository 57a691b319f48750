"""The toolchain layer, below the rungs and the harness: what the GPU and the compilers are.

* :mod:`common.toolchain.arch`: the sm_90 constants and the one check "is this an sm_90 device";
* :mod:`common.toolchain.compile`: compile a Triton, Gluon or CuTe kernel for sm_90a without a GPU
  (:class:`~common.toolchain.compile.KernelBinary`: its PTX, cubin and launch shape);
* :mod:`common.toolchain.releases`: the tested Triton releases and their tile overrides.

It imports nothing else from ``common``, so a rung and every harness layer may use it (the layer order
is in ``common/__init__.py``).
"""
