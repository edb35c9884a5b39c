// The control of Docs.UndocumentedNameFailsTheReference: a public class and
// member without doxygen comments. The API reference run over this header
// alone must fail, or the warnings-as-errors setting is not in force.
#pragma once

namespace paratrain_docs_fixture {

class Undocumented {
 public:
  int value() const { return 0; }
};

}  // namespace paratrain_docs_fixture
