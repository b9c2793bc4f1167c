import sys

from onnx2tf_alt.cli.main import main

sys.exit(main())
