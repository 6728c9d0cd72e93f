import pytest

from jaxrl_post.config_args import parse_arg


def test_parse_arg_types_and_flags():
  arg = parse_arg("runlocal,model=tiny,steps=7,lr=0.5", runlocal=False, model="small",
                  steps=100, lr=1e-3)
  assert arg.runlocal is True and arg.model == "tiny" and arg.steps == 7 and arg.lr == 0.5
  assert parse_arg(None, runlocal=False).runlocal is False
  assert parse_arg("runlocal=false", runlocal=True).runlocal is False


def test_parse_arg_errors_name_the_problem():
  with pytest.raises(ValueError, match="unknown config arg 'modle'; valid: model, runlocal"):
    parse_arg("modle=x", runlocal=False, model="small")
  with pytest.raises(ValueError, match="steps='many' is not a int"):
    parse_arg("steps=many", steps=1)
