#pragma once
// A directory written beside its target and published in one step, as a
// checkpoint is: a reader of the target sees the whole earlier version or
// the whole new one, never a mix. Light header: no LibTorch.
//
// [Note: an export is published whole]
// An export over an earlier export used to rewrite its files one by one: a
// disk full or a kill midway left shard 1 of one model beside shards 2-5
// and the index of another, which transformers and `fsdp generate` load
// without complaint. Now the export is written into `.<name>.partial-<host>-
// <pid>` beside the target, and `publish` swaps the two directories with
// one renameat2(RENAME_EXCHANGE) (two renames where the file system lacks
// it: then a crash between them leaves the new version at the partial name
// and the old one at `.<name>.old-...`, the target missing, nothing mixed).
// Files of the earlier version that the new one does not write and `keep`
// accepts (a README the user added, say) are linked into the new version
// first. Unpublished, the partial directory is removed when the StagedDir
// goes; after a kill it stays, and the next StagedDir for the same target
// on this host removes those of processes that have ended.

#include <functional>
#include <string>

namespace fsdp::io {

class StagedDir {
 public:
  // Creates the partial directory beside `target` (whose parent is created
  // when missing). Throws fsdp::Error naming `what` and the path.
  StagedDir(std::string target, std::string what);
  ~StagedDir();
  StagedDir(const StagedDir&) = delete;
  StagedDir& operator=(const StagedDir&) = delete;

  // Where to write the new version.
  const std::string& path() const { return partial_; }
  // Makes the partial directory the target. `keep(name)`: whether a file or
  // directory of the earlier target that the new version lacks carries over.
  void publish(const std::function<bool(const std::string&)>& keep);

 private:
  std::string target_, what_, partial_;
  bool published_ = false;
};

}  // namespace fsdp::io
