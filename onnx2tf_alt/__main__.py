from onnx2tf_alt.cli.entry import run_and_exit

run_and_exit()
