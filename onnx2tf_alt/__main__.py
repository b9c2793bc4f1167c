from onnx2tf_alt.cli.main import run_and_exit

run_and_exit()
