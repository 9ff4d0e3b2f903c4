"""A SavedModel root's own functions that are also its signatures, kept in the optimized model.

Keras' `model.export()` makes `serve` both a signature and a function of the
root, and Keras documents calling it so: `tf.saved_model.load(path).serve(x)`.
A signature takes and returns flat dicts; the root's function takes the
model's own inputs and returns its own output structure. The optimized model
gets the same function, calling the rewritten signature.
"""

import tensorflow as tf


def endpoint(root, key: str, signature: tf.types.experimental.ConcreteFunction,
             input_names: list[str]) -> tf.types.experimental.PolymorphicFunction | None:
    """`root.<key>` rebuilt over `signature` (the rewritten signature, taking its inputs
    positionally in `input_names` order and returning a dict by output name), or None where the
    root has no such function, or its flattened inputs and outputs are not the signature's."""
    concrete = getattr(getattr(root, key, None), "concrete_functions", [])
    if len(concrete) != 1:
        return None
    (original,) = concrete
    args, kwargs = original.structured_input_signature
    specs, outputs = tf.nest.flatten(args), original.structured_outputs
    output_names = (sorted(outputs) if isinstance(outputs, dict)  # the order tf.nest flattens a dict in
                    else [f"output_{i}" for i in range(len(tf.nest.flatten(outputs)))])
    if (kwargs or sorted(spec.name for spec in specs) != sorted(input_names)
            or sorted(output_names) != sorted(signature.structured_outputs)):
        return None

    def call(*inputs):
        by_name = {spec.name: tensor for spec, tensor in zip(specs, tf.nest.flatten(inputs))}
        results = signature(*[by_name[name] for name in input_names])
        return tf.nest.pack_sequence_as(outputs, [results[name] for name in output_names])

    return tf.function(call, input_signature=list(args))
