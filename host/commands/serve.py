"""``flashlm serve``: start a virtual board and leave it running, for ``flashlm run --port``."""
from __future__ import annotations

import time

from ..boards.builds import ensure_firmware
from ..boards.virtual import check_virtual_board, start_virtual_board
from ..errors import UserError
from ..interrupts import interrupts
from ..model_dir import ModelDir


def serve(console, model_path, board: str = "native", timeout: float = 10.0, counts=None,
          xip_model: bool = True) -> int:
    """Serve ``board`` (native or an emulated one) for the model at ``model_path`` until Ctrl-C;
    ``counts``: where the emulated board writes its per-step read counts."""
    emulated = check_virtual_board(board)
    model = ModelDir.open(model_path)
    image = ensure_firmware(console, model, board)
    with interrupts() as ctrl_c, start_virtual_board(board, image, model.blob, timeout, xip_model,
                                                                counts_path=counts) as vb:
        console.print(f"[bold]{board}[/] serving on [bold]{vb.port}[/] (pid {vb.proc.pid}); "
                      f"'flashlm run --port {vb.port} --model {model.path} ...' talks to it; Ctrl-C stops it",
                      soft_wrap=True)
        if emulated == "rp2040js":
            console.print(f"  per-step read counts from the emulator harness: {vb.counts_path}", soft_wrap=True)
        try:
            while vb.alive:
                time.sleep(0.5)
        except KeyboardInterrupt:
            ctrl_c.hold()       # another Ctrl-C must not cut the board's clean-up short
            return 0
        raise UserError(vb.describe_exit() or "the board stopped")
