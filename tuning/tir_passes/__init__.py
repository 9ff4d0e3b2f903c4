"""Our TIR passes, which kernels are compiled with after TVM's default TIR pipeline.

One module per pass (its docstring says why the pass exists), `ir` for the helpers they share,
`markers` for the marks templates leave for them, and `pipeline` for the order they run in,
the one place a pass is registered (an entry there; measure.build compiles with it).
"""
