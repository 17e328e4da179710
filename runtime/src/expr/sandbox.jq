# Definitions the sandbox adds to jq: sandboxed replacements of standard ones, and `range/3`
# as a recursion that burns fuel. Compiled with the prelude; every one must be on ALLOWED.
def fromjson: __json_depth | __fromjson;
def matches(re; flags): __regex_guard(flags) | __matches(re; flags);
def split_matches(re; flags): __regex_guard(flags) | __split_matches(re; flags);
def split_(re; flags): __regex_guard(flags) | __split_(re; flags);
def debug: .;
def debug(msgs): .;
def stderr: .;
def range($from; $upto; $by):
  def up: if . < $upto then ., (. + $by | up) else empty end;
  def down: if . > $upto then ., (. + $by | down) else empty end;
  if $by > 0 then $from | up elif $by < 0 then $from | down else empty end;
