"""`python app.py`: the DFlash playground in a browser, on the shipped default pair. Installed,
the same is the `dflash-playground` command (the launcher lives in dflash_core/playground.py).

    python app.py                          # http://127.0.0.1:7860, opens a browser tab
    python app.py --share                  # plus a public gradio.live link (needs internet)
    python app.py --host 0.0.0.0 --auth me:secret
    python app.py --model DIR --draft DIR  # another local pair, offered first
    GRADIO_SERVER_NAME=0.0.0.0 GRADIO_SERVER_PORT=7861 python app.py   # as containers and Spaces set them
"""

import sys

from dflash_core.playground import main

if __name__ == "__main__":
    sys.exit(main())
