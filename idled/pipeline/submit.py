"""spark-submit entry for the pipeline job.

    spark-submit --master spark://host:7077 --py-files idled.zip \
        "$(python -c 'import idled.pipeline.submit as m; print(m.__file__)')" --events /data/d0 --out /data/out

Takes the flags of `idled pipeline run`; without --master it uses the master spark-submit configured.
"""

import sys

from idled.pipeline.runflags import main_submit

if __name__ == "__main__":
    sys.exit(main_submit())
