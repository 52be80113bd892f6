"""What a strategy is and how TensorFlow makes it: the registry (plain records), the builders,
cluster specs (TF_CONFIG, Kubeflow JobSet pods) and the placement of layers on devices.

Nothing here starts a process or reads a config object; cluster/ and train/ build on it.
"""
