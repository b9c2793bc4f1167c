import sys

from onnx2tf_alt.cli import main

sys.exit(main())
