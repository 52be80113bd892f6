"""How this process's TensorFlow runtime uses the machine: TensorFlow's lazy import, oneDNN, thread pools and logical
CPU devices, the memory allocator. All are fixed once TensorFlow runs its first op (the allocator once the program
starts), so a training process sets them first thing."""
