import pytest

from tools import (INVALID_ARGUMENTS, TOOL_ERROR, UNKNOWN_TOOL, RegistryError, Tool, ToolError,
                   ToolRegistry, UnknownToolError, create_default_registry)


def _echo_tool(name: str = "echo") -> Tool:
    def run(args: dict) -> str:
        if args["text"] == "boom":
            raise ToolError("exploded")
        return args["text"] * args.get("times", 1)

    return Tool(name, "Repeat text.", {
        "type": "object",
        "properties": {"text": {"type": "string"}, "times": {"type": "integer", "minimum": 1}},
        "required": ["text"]}, run)


@pytest.fixture
def registry() -> ToolRegistry:
    reg = ToolRegistry()
    reg.register(_echo_tool())
    return reg


def test_valid_call_runs_executor(registry):
    result = registry.execute("echo", {"text": "ab", "times": 2})
    assert result.success and result.content == "abab" and result.error is None


def test_unknown_tool_is_rejected(registry):
    result = registry.execute("shell", {"cmd": "ls"})
    assert not result.success and result.error_kind == UNKNOWN_TOOL and "shell" in result.error
    with pytest.raises(UnknownToolError):
        registry.get("shell")


def test_duplicate_registration_is_rejected(registry):
    with pytest.raises(RegistryError, match="already registered"):
        registry.register(_echo_tool())


def test_invalid_schema_is_rejected():
    bad = Tool("bad", "x", {"type": "object", "properties": {"a": {"type": "no-such-type"}}}, str)
    with pytest.raises(RegistryError, match="invalid schema"):
        ToolRegistry().register(bad)


@pytest.mark.parametrize("args, fragment", [
    ({}, "'text' is a required property"),
    ({"text": "a", "extra": 1}, "Additional properties"),
    ({"text": 5}, "is not of type 'string'"),
    ({"text": "a", "times": "2"}, "is not of type 'integer'"),
    ({"text": "a", "times": 0}, "minimum"),
    (["text"], "must be a JSON object"),
])
def test_invalid_arguments_are_rejected(registry, args, fragment):
    result = registry.execute("echo", args)
    assert not result.success and result.error_kind == INVALID_ARGUMENTS
    assert fragment in result.error


def test_tool_error_becomes_failed_result(registry):
    result = registry.execute("echo", {"text": "boom"})
    assert not result.success and result.error_kind == TOOL_ERROR and result.error == "exploded"


def test_openai_schema_export():
    schemas = create_default_registry().openai_schemas()
    names = [s["function"]["name"] for s in schemas]
    assert names == ["calculator", "retrieve_note"]
    for schema in schemas:
        assert schema["type"] == "function"
        fn = schema["function"]
        assert fn["description"] and fn["parameters"]["type"] == "object"
        assert fn["parameters"]["additionalProperties"] is False
    calc = schemas[0]["function"]["parameters"]
    assert calc["required"] == ["expression"]


def test_export_is_a_copy(registry):
    registry.openai_schemas()[0]["function"]["parameters"]["required"].append("times")
    assert registry.execute("echo", {"text": "a"}).success
