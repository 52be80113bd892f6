"""The compare stage: the comparison computed (compute: no TensorFlow, no MLflow), laid out as markdown,
HTML and figures (render), and written and attached to the execution's run (stage).
"""
