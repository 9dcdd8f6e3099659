"""Write the policy's workflow-action rules into the README's access section (between the
``<!-- workflow-actions -->`` markers); ``tests/platform_api/test_policy_actions.py`` keeps
the two equal."""

from __future__ import annotations

from pathlib import Path

from platform_api.policy.actions import render_actions

README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- workflow-actions -->", "<!-- /workflow-actions -->"


def main() -> None:
    text = README.read_text()
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    README.write_text(f"{before}{START}\n{render_actions()}\n{END}{after}")


if __name__ == "__main__":
    main()
