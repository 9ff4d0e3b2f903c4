"""The DietCode auto-scheduler on TVM: micro-kernels, cost model, search, dispatch, bundles."""
